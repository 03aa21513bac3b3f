"""Theoretical PCIe link bandwidth per generation."""

from __future__ import annotations

import pytest

from exporter.model import Sample
from exporter.pipeline.pcie import link_max_bytes_per_second


def link_max(rate: float | None, width: int | None) -> float | None:
    return link_max_bytes_per_second(Sample(0.0, pcie_link_transfers_per_second=rate, pcie_link_width=width))


@pytest.mark.parametrize(
    ("rate", "width", "expected"),
    [
        (2.5e9, 1, 250e6),  # PCIe 1.x: 8b/10b
        (5e9, 16, 8e9),  # PCIe 2.0 x16: 500 MB/s a lane
        (8e9, 16, 8e9 * 16 * 128 / 130 / 8),  # PCIe 3.0 x16: ~15.75 GB/s
        (16e9, 16, 16e9 * 16 * 128 / 130 / 8),  # PCIe 4.0 x16 (MI210/MI250X): ~31.5 GB/s
        (32e9, 16, 32e9 * 16 * 128 / 130 / 8),  # PCIe 5.0 x16 (MI300X): ~63 GB/s
        (64e9, 16, 64e9 * 16 * 242 / 256 / 8),  # PCIe 6.0 FLIT mode: ~121 GB/s
        (16e9, 8, 16e9 * 8 * 128 / 130 / 8),  # a link trained down to x8 halves it
    ],
)
def test_theoretical_bandwidth_per_generation(rate: float, width: int, expected: float) -> None:
    assert link_max(rate, width) == pytest.approx(expected, rel=1e-12)


def test_pcie4_x16_is_the_familiar_31_5_gb_per_second() -> None:
    assert link_max(16e9, 16) == pytest.approx(31.5e9, rel=1e-3)


@pytest.mark.parametrize(("rate", "width"), [(None, 16), (16e9, None), (16e9, 0), (12.8e9, 16), (0.0, 16)])
def test_unknown_speed_or_width_gives_none(rate: float | None, width: int | None) -> None:
    assert link_max(rate, width) is None


def test_no_sample_gives_none() -> None:
    assert link_max_bytes_per_second(None) is None
