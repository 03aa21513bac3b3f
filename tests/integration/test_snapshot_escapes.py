"""Issue 31 (cases 9 and 11): `snapshot` never sends a control character it read to the terminal: a CPER
record id of `\\x1b]0;PWN\\x07` (which would set the terminal's title) reaches it neither raw nor as
control characters. The CPER parser already turns a record id's control bytes into "?" (the signals
are cleaned when read); snapshot's own escaping (terminal_safe) is held by tests/unit/test_snapshot_table.py."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.simulator import Simulator
from tests.realtools import EXPORTER

pytestmark = pytest.mark.integration

HOSTILE_ID = b"\x1b]0;PWN\x07"  # exactly the 8 bytes of a record id


@pytest.fixture
def sysfs() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="snapshot-escapes-"))
    try:
        scenario = "idle:faults=cper_fatal.0,fault_at=0,fault_for=600"
        simulator = Simulator(root / "sys", fleet="MI300X", scenario=scenario)
        simulator.write_tree()
        simulator.tick(5.0)
        (ring,) = (root / "sys" / "kernel" / "debug" / "dri").glob("*/amdgpu_ring_cper")
        data = bytearray(ring.read_bytes())
        offset, patched = 12, 0
        while len(data) - offset >= 128 and data[offset : offset + 4] == b"CPER":
            data[offset + 96 : offset + 104] = HOSTILE_ID
            offset += struct.unpack_from("<I", data, offset + 20)[0]
            patched += 1
        assert patched, "the simulator wrote no CPER record"
        ring.write_bytes(bytes(data))
        yield root / "sys"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_cper_record_id_with_a_terminal_escape_is_shown_escaped(sysfs: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "AMDGPU_EXPORTER_LOG_FORMAT"}
    result = subprocess.run(
        [EXPORTER, "snapshot", f"--path.sysfs={sysfs}", "--source=sysfs"], capture_output=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    assert b"cper_fatal" in result.stdout, result.stdout.decode()
    assert b"\x1b" not in result.stdout and b"\x07" not in result.stdout
    assert b"?]0;PWN?" in result.stdout  # the id as the parser cleaned it
    as_json = subprocess.run(
        [EXPORTER, "snapshot", f"--path.sysfs={sysfs}", "--source=sysfs", "--json"], capture_output=True, timeout=60
    )
    assert b"\x1b" not in as_json.stdout and b"\x07" not in as_json.stdout
