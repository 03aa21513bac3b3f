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


def link_max_bytes_per_second(transfers_per_second: float | None, width: int | None) -> float | None:
    """Bytes per second one direction of the link can carry at this speed and width; None if unknown."""
    if transfers_per_second is None or width is None or width <= 0:
        return None
    efficiency = LINE_CODE_EFFICIENCY.get(float(transfers_per_second))
    if efficiency is None:
        return None
    return float(transfers_per_second) * width * float(efficiency) / 8
