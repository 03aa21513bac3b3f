"""Coverage-guided fuzz target (atheris, libFuzzer) for the gpu_metrics and CPER ring decoders, the
board/ temperature tables and the text parsers.

    python -m tests.fuzz.fuzz_parsers -max_total_time=60 [corpus_dir]

The contract under fuzzing: whatever bytes a sysfs file holds, a parser returns a value or raises
its own error type (GpuMetricsError, CperParseError, TextParseError), never anything else, and what it returns is
finite (no NaN or inf can reach a Sample). Any other exception is a crash libFuzzer reports with the
input that caused it. The seeds are real tables from the simulator, so mutation starts from what
the driver writes.
"""

from __future__ import annotations

import contextlib
import math
import sys

import atheris

with atheris.instrument_imports():
    from exporter.abi.board import BASEBOARD_TEMP, GPUBOARD_TEMP
    from exporter.sources import textfiles as tf
    from exporter.sources.cper import CperParseError, parse_cper_ring
    from exporter.sources.gpu_metrics import GpuMetricsError, decode_gpu_metrics
    from exporter.sources.sysfs import board

TEXT_PARSERS = (
    tf.parse_unsigned,
    tf.parse_signed,
    tf.parse_percent_ratio,
    lambda text: tf.parse_scaled(text, 1e-3),
    tf.parse_pp_dpm,
    tf.parse_link_speed,
    tf.parse_link_width,
    tf.parse_ras_err_count,
    tf.parse_fw_version,
    tf.parse_unique_id,
    tf.parse_hex_id,
    tf.parse_pcie_bw,
    tf.parse_key_values,
    tf.parse_uevent,
    tf.parse_word,
    board.parse_npm_status,
    tf.parse_bad_pages,
    lambda text: tf.parse_aer_total(text, "fatal"),
    lambda text: tf.parse_aer_total(text, "correctable"),
    tf.parse_devcoredump_time,
)


def _finite(value: object) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise AssertionError(f"non-finite value {value!r}")
    if isinstance(value, dict) or hasattr(value, "items"):
        for item in value.values():  # type: ignore[union-attr]
            _finite(item)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    selector, payload = data[0], data[1:]
    if selector % 4 == 2:
        try:
            records = parse_cper_ring(payload)
        except CperParseError:
            return
        for record in records:
            _finite(record.timestamp)
            assert record.severity in ("fatal", "nonfatal", "corrected"), record
        return
    if selector % 2 == 0:
        try:
            metrics = decode_gpu_metrics(payload)
        except GpuMetricsError:
            return
        for name in ("temperatures", "busy", "clocks_hertz", "voltages_volts", "xgmi_read_bytes"):
            _finite(getattr(metrics, name))
        for name in ("power_watts", "energy_joules", "pcie_bandwidth_bytes_per_second"):
            _finite(getattr(metrics, name))
        return
    if selector % 4 == 1:  # the board/ temperature tables (MI350-class), binary like gpu_metrics
        for table in (GPUBOARD_TEMP, BASEBOARD_TEMP):
            with contextlib.suppress(tf.TextParseError):
                _finite(board.parse_temp_table(payload, table))
        return
    parser = TEXT_PARSERS[(selector // 4) % len(TEXT_PARSERS)]
    text = payload.decode("ascii", errors="replace")  # what files.read_parsed hands a parser is str
    try:
        _finite(parser(text))
    except tf.TextParseError:
        return


def main(argv: list[str]) -> None:
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
