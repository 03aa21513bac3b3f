"""The board/ group of MP1 13.0.12 parts (MI350X, MI355X): parsers (pure) and the one reader.

amdgpu_pm.c makes board/ on the PCI device when the SMU has temperature tables: gpuboard_temp and
baseboard_temp (binary, abi/board.py); when it also reports a node power limit, five text
files, each `%u\\n` or a word: npm_status (`enabled` while node power reads non-zero, else
`disabled`), cur_node_power_limit, max_node_power_limit, node_power (W, the firmware's Q10 value
rounded; read every cycle), global_ppt_resid (an accumulator of undocumented unit, not read), and, from a later
patch, baseboard_power (W, every cycle) and baseboard_power_limit (W): the universal baseboard's. MI300X/MI325X have
no board/: its absence is no fault (a missing file is simply not supplied).

The baseboard and the node are the same for every GPU on it: each GPU reads them, the exposition
shows them once per node (exposition/metrics.py, the node families).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from exporter.abi.board import (
    BASEBOARD_TEMP,
    GPUBOARD_TEMP,
    HEADER_BYTES,
    TEMP_TABLE_VERSION,
    UNUSED_ENTRY,
    TempTable,
)
from exporter.sources import textfiles as tf
from exporter.sources.errors import record
from exporter.sources.sysfs.files import read_file_bytes, read_parsed
from exporter.sources.sysfs.table import SampleValues

_SIGN_BIT = 1 << 23  # the 24-bit temperature field is the kernel's int masked to 24 bits


def parse_temp_table(blob: bytes, table: TempTable) -> dict[str, float]:
    """A board temperature table -> sensor name -> °C; TextParseError when the blob is not that table.

    Sensors come by id (bits 24-31), so an entry's position does not matter; an id the kernel's
    enum does not name, and an all-ones entry, are skipped. A sensor given twice keeps its first value.
    """
    if len(blob) < HEADER_BYTES:
        raise tf.TextParseError("shorter than the table header")
    size, fmt, content = struct.unpack_from("<HBB", blob)
    if (fmt, content) != TEMP_TABLE_VERSION:
        raise tf.TextParseError(f"table version {fmt}.{content}, not {TEMP_TABLE_VERSION[0]}.{TEMP_TABLE_VERSION[1]}")
    if size != table.size or len(blob) < table.size:
        raise tf.TextParseError(f"{len(blob)} bytes, structure_size {size}: not the {table.size}-byte {table.file}")
    found: dict[str, float] = {}
    for array in table.arrays:
        for entry in struct.unpack_from(f"<{array.entries}I", blob, array.offset):
            sensor = entry >> 24
            if entry == UNUSED_ENTRY or sensor >= len(array.names):
                continue
            raw = entry & 0xFFFFFF
            found.setdefault(array.names[sensor], float(raw - (raw & _SIGN_BIT) * 2))
    return found


def parse_npm_status(text: str | bytes) -> bool:
    """npm_status `enabled\\n` / `disabled\\n` -> node power management on."""
    word = tf.parse_word(text)
    if word not in ("enabled", "disabled"):
        raise tf.TextParseError(f"{word!r} is neither enabled nor disabled")
    return word == "enabled"


def _watts(text: str) -> float:
    return float(tf.parse_unsigned(text))


# Sample field -> board/ text file, all in W (node_power itself is a row of table.CYCLE_FILES: read every cycle)
NODE_POWER_FILES = (
    ("node_power_limit_watts", "cur_node_power_limit"),
    ("node_power_limit_max_watts", "max_node_power_limit"),
    ("baseboard_power_limit_watts", "baseboard_power_limit"),
)
TEMP_TABLES = (("board_temperatures", GPUBOARD_TEMP), ("baseboard_temperatures", BASEBOARD_TEMP))


def read_board(
    device_dir: str,
    values: SampleValues,
    read: Callable[[str], bytes | None] = read_file_bytes,
    skip: frozenset[str] = frozenset(),
) -> None:
    """The slow board/ values of one PCI device into `values` (nothing at all without a board/ folder):
    each file is a firmware round trip for the SMU's system metrics table. `read` opens only the
    files discovery found (sysfs/present.py); a field of `skip` (no family shown reads it) is not read:
    the GPU board's 19 sensors (gpuboard_temp) and the baseboard's 23 are off by default."""
    board = f"{device_dir}/board"
    for field, table in TEMP_TABLES:
        if field in skip:
            continue
        path = f"{board}/{table.file}"
        blob = read(path)
        if blob is None:
            continue
        try:
            temps = parse_temp_table(blob, table)
        except tf.TextParseError as error:
            record(path, "parse", str(error))
            continue
        for sensor, celsius in temps.items():
            values.set(field, sensor, celsius, f"board/{table.file}")
    for field, name in NODE_POWER_FILES:
        if field not in skip:
            values.set(field, None, read_parsed(f"{board}/{name}", _watts, read), f"board/{name}")
    if "node_power_management_enabled" not in skip:
        enabled = read_parsed(f"{board}/npm_status", parse_npm_status, read)
        values.set("node_power_management_enabled", None, enabled, "board/npm_status")
