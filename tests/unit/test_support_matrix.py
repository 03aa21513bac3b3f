"""docs/support-matrix.md is generated from the code's tables and kept in sync; what it claims beyond
its own columns holds."""

import pytest

from exporter.exposition.support_matrix import BOARD_FAMILIES, DOC, _families, render
from exporter.simulator.asics import ASICS, KERNEL_TABLES


def test_the_support_matrix_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/support-matrix.md is stale: run python -m exporter.exposition.support_matrix --write"
    )


def test_every_asic_defaults_to_a_current_kernels_table_and_can_write_it() -> None:
    for model in ASICS.values():
        assert model.metrics_version == KERNEL_TABLES[model.smu_driver][-1][1]
        assert model.metrics_version in model.metrics_versions, model.name


@pytest.mark.parametrize("version", ["1.8", "1.9"])
@pytest.mark.parametrize("model", ["MI325X", "MI350X", "MI355X"])
def test_the_other_mi300_class_asics_give_what_the_mi300x_columns_say(model: str, version: str) -> None:
    socket, partition = _families(f"{model}:CPX:gpu_metrics={version}")
    # MP1 13.0.12 (MI350X/MI355X) adds the board/ group on the socket; MI300X/MI325X have none
    board = BOARD_FAMILIES if ASICS[model].smu_driver == "smu_v13_0_12_ppt.c" else set()
    assert (socket - board, partition) == _families(f"MI300X:CPX:gpu_metrics={version}")
    assert board <= socket
