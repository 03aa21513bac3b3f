"""The board/ group of MP1 13.0.12 parts (MI350X, MI355X): what the node's baseboard reports.

amdgpu_pm.c writes, on each GPU's PCI device: gpuboard_temp and baseboard_temp (binary tables,
abi/board.py), and npm_status, cur_node_power_limit,
max_node_power_limit, node_power, global_ppt_resid, and (a later patch) baseboard_power and
baseboard_power_limit (`%u\\n`, `enabled`/`disabled`). Node power and
the baseboard temperatures come from the one baseboard, so every GPU of the node reads the same.

No real table has been seen here: which sensors the firmware fills, and their values, are
plausible figures (temperatures rise with the board's and the node's power), the formats exact.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.abi.board import (
    BASEBOARD_TEMP,
    GPUBOARD_TEMP,
    NODE_SENSORS,
    SYSTEM_SENSORS,
    TEMP_TABLE_VERSION,
    VR_SENSORS,
    TempTable,
)
from exporter.simulator.fleet import GcdLayout
from exporter.simulator.physics import DieReading

BASEBOARD_POWER_W = 240  # the baseboard's own draw (switches, retimers, FPGA) on top of the GPUs'
HOST_POWER_W = 1500  # the rest of the node (CPUs, memory, NICs, fans): node power = baseboard power + this
# (°C at idle, °C per kW of the board's power): the GPU board's sensors
_NODE_SENSOR_MODEL = {
    "retimer_x": (34, 8),
    "oam_x_ibc": (36, 10),
    "oam_x_ibc_2": (35, 10),
    "oam_x_vdd18_vr": (38, 12),
    "oam_x_04_hbm_b_vr": (40, 15),
    "oam_x_04_hbm_d_vr": (40, 14),
}
_VR_SENSOR_MODEL = {name: (36 + i % 5, 10 + 2 * (i % 6)) for i, name in enumerate(VR_SENSORS)}


@dataclass(frozen=True, slots=True)
class BoardReading:
    """What one GPU's board/ files say at one instant (whole °C and W, as the driver writes them)."""

    gpuboard: Mapping[str, int]  # sensor -> °C of this GPU's board
    baseboard: Mapping[str, int]  # sensor -> °C of the node's baseboard
    node_power_w: int
    node_power_limit_w: int
    max_node_power_limit_w: int
    baseboard_power_w: int  # what the baseboard (its GPUs included) draws: board/baseboard_power
    baseboard_power_limit_w: int

    @property
    def npm_enabled(self) -> bool:
        return self.node_power_w != 0  # the driver's rule: enabled while node power reads non-zero


def has_board(gcd: GcdLayout) -> bool:
    return bool(gcd.model.max_node_power_limit) and not gcd.guest


def board_readings(gcds: Sequence[GcdLayout], readings: Sequence[DieReading]) -> list[BoardReading | None]:
    """Per GCD, its board/ reading (None for a part without the group). The node is every GCD that has it."""
    on_board = [(g, r) for g, r in zip(gcds, readings, strict=True) if has_board(g)]
    if not on_board:
        return [None] * len(gcds)
    baseboard_w = sum(r.power_w or 0 for _g, r in on_board) + BASEBOARD_POWER_W
    node_w = baseboard_w + HOST_POWER_W
    node_kw = baseboard_w / 1000
    baseboard = {name: round(26 + i % 6 + node_kw * (1.2 + 0.1 * (i % 4))) for i, name in enumerate(SYSTEM_SENSORS)}
    limit = max(g.model.max_node_power_limit for g, _r in on_board)
    # the baseboard's threshold: its GPUs' power caps and its own draw
    baseboard_limit = sum(g.model.power_cap for g, _r in on_board) + BASEBOARD_POWER_W
    result: list[BoardReading | None] = []
    for gcd, r in zip(gcds, readings, strict=True):
        if not has_board(gcd):
            result.append(None)
            continue
        kw = (r.power_w or 0) / 1000
        own = {
            name: round(idle + per_kw * kw)
            for name, (idle, per_kw) in {**_NODE_SENSOR_MODEL, **_VR_SENSOR_MODEL}.items()
        }
        result.append(BoardReading(own, baseboard, node_w, limit, limit, baseboard_w, baseboard_limit))
    return result


def encode_temp_table(table: TempTable, temps: Mapping[str, int], accumulation_counter: int = 0) -> bytes:
    """A board temperature table as the driver fills it: all-ones, the header, then each array's
    sensors packed from index 0 (id << 24 | °C in 24 bits)."""
    blob = bytearray(b"\xff" * table.size)
    struct.pack_into("<HBBHHQ", blob, 0, table.size, *TEMP_TABLE_VERSION, 1, 0, accumulation_counter)
    for array in table.arrays:
        entries = [(i << 24) | (temps[name] & 0xFFFFFF) for i, name in enumerate(array.names) if name in temps]
        struct.pack_into(f"<{len(entries)}I", blob, array.offset, *entries[: array.entries])
    return bytes(blob)


def board_files(gcd: GcdLayout, board: BoardReading, accumulation_counter: int) -> dict[str, bytes]:
    """Path (relative to the sysfs root) -> content of one GPU's changing board/ files."""
    base = f"{gcd.device_relpath}/board"
    return {
        f"{base}/{GPUBOARD_TEMP.file}": encode_temp_table(GPUBOARD_TEMP, board.gpuboard, accumulation_counter),
        f"{base}/{BASEBOARD_TEMP.file}": encode_temp_table(BASEBOARD_TEMP, board.baseboard, accumulation_counter),
        f"{base}/node_power": f"{board.node_power_w}\n".encode(),
        f"{base}/cur_node_power_limit": f"{board.node_power_limit_w}\n".encode(),
        f"{base}/npm_status": b"enabled\n" if board.npm_enabled else b"disabled\n",
        f"{base}/baseboard_power": f"{board.baseboard_power_w}\n".encode(),
        f"{base}/baseboard_power_limit": f"{board.baseboard_power_limit_w}\n".encode(),
        # an accumulator of undocumented unit: written so the group is complete, read by no one here
        f"{base}/global_ppt_resid": f"{accumulation_counter // 1024}\n".encode(),
    }


# The sensor names each table can carry (for tests and the truth's keys).
GPUBOARD_SENSORS = (*NODE_SENSORS, *VR_SENSORS)
