"""The theoretical bandwidth of a PCIe link, from its current speed and width.

What "80 % of theoretical" is measured against: the payload a link can carry in one direction,
lane rate x lanes x the generation's line-code efficiency / 8 bits:
  - 2.5 and 5 GT/s (PCIe 1.x, 2.x): 8b/10b, 8 data bits per 10 line bits;
  - 8, 16 and 32 GT/s (3.0, 4.0, 5.0): 128b/130b;
  - 64 GT/s (6.0) and 128 GT/s (7.0): FLIT mode, 256-byte FLITs of which 242 bytes carry TLPs and
    DLLPs (the other 14 are CRC and FEC).
Packet headers are not subtracted (they depend on the payload size the devices negotiate), so
real transfers top out somewhat below this figure. A rate that is not a PCIe rate gives None.
"""

from __future__ import annotations

from fractions import Fraction

from exporter.model import Sample

# transfers per second -> data bits per line bit
LINE_CODE_EFFICIENCY: dict[float, Fraction] = {
    2.5e9: Fraction(8, 10),
    5e9: Fraction(8, 10),
    8e9: Fraction(128, 130),
    16e9: Fraction(128, 130),
    32e9: Fraction(128, 130),
    64e9: Fraction(242, 256),
    128e9: Fraction(242, 256),
}


def link_max_bytes_per_second(sample: Sample | None) -> float | None:
    """Bytes per second one direction of the sample's link can carry at its speed and width; None if unknown."""
    if sample is None or sample.pcie_link_transfers_per_second is None or not sample.pcie_link_width:
        return None
    rate, width = sample.pcie_link_transfers_per_second, sample.pcie_link_width
    efficiency = LINE_CODE_EFFICIENCY.get(float(rate))
    return None if efficiency is None or width < 0 else float(rate) * width * float(efficiency) / 8
