"""The bench's pure helpers: report formatting and the parsers of wrk, strace and rocm-smi output.

The bench itself (python -m bench) is not part of the tests; these only keep its arithmetic and
parsing honest, in milliseconds.
"""

from __future__ import annotations

import pytest

from bench import report
from bench.loadgen import LoadGenError, parse_wrk_report
from bench.rocmsmi import gcds_in_output
from bench.syscalls import parse_line, split_cycles


def test_markdown_table_pads_columns_and_right_aligns_numbers() -> None:
    table = report.markdown_table(
        ["server", "req/s"], [["ours", "4,000"], ["node_exporter", "80"]], right=[False, True]
    )
    assert table.splitlines() == [
        "| server        | req/s |",
        "|---------------|------:|",
        "| ours          | 4,000 |",
        "| node_exporter |    80 |",
    ]


def test_markdown_table_rejects_a_short_row() -> None:
    with pytest.raises(ValueError, match="2 columns"):
        report.markdown_table(["a", "b"], [["only one"]])


@pytest.mark.parametrize(
    ("value", "text"),
    [(412e-6, "412 µs"), (3.0712e-3, "3.07 ms"), (1.2, "1.2 s"), (0.0, "0"), (None, "n/a"), (1234.5, "1234 s")],
)
def test_seconds_keeps_three_significant_figures(value: float | None, text: str) -> None:
    assert report.seconds(value) == text


@pytest.mark.parametrize(("value", "text"), [(57.04, "57x"), (0.934, "0.93x"), (1 / 310, "1/310"), (None, "n/a")])
def test_ratio(value: float | None, text: str) -> None:
    assert report.ratio(value) == text


WRK_OUTPUT = """Running 5s test @ http://127.0.0.1:1234/metrics
  2 threads and 64 connections
Requests/sec:   4000.00
BENCH_WRK {"requests": 20100, "duration_us": 5000000, "bytes": 2010000, "connect_errors": 0, \
"read_errors": 1, "write_errors": 0, "status_errors": 100, "timeouts": 2, "p50_us": 12000, \
"p90_us": 20000, "p99_us": 41000, "max_us": 90000, "mean_us": 13000.5}
"""


def test_wrk_report_counts_only_successful_answers_as_scrapes() -> None:
    result = parse_wrk_report(WRK_OUTPUT, connections=64)
    assert result.answered == 20000
    assert result.requests_per_second == pytest.approx(4000.0)
    assert result.errors == 103
    assert result.p50_seconds == pytest.approx(0.012)
    assert result.p99_seconds == pytest.approx(0.041)


def test_wrk_report_missing_is_an_error_not_a_zero() -> None:
    with pytest.raises(LoadGenError, match="no report line"):
        parse_wrk_report("Running 5s test\nsocket errors: connect 64\n", connections=64)


STRACE_LOG = """\
100 openat(AT_FDCWD</w>, "/tmp/t/sys/x/gpu_metrics", O_RDONLY|O_CLOEXEC) = 3</tmp/t/sys/x/gpu_metrics>
100 openat(AT_FDCWD</w>, "/bench-marker/cycle-0", O_RDONLY) = -1 ENOENT (No such file or directory)
101 openat(AT_FDCWD</w>, "/tmp/t/sys/x/gpu_metrics", O_RDONLY|O_CLOEXEC <unfinished ...>
100 futex(0x7f00, FUTEX_WAKE_PRIVATE, 1 <unfinished ...>
101 <... openat resumed>) = 5</tmp/t/sys/x/gpu_metrics>
101 read(5</tmp/t/sys/x/gpu_metrics>, ""..., 65536) = 120
101 read(5</tmp/t/sys/x/gpu_metrics>, "", 65536) = 0
101 close(5</tmp/t/sys/x/gpu_metrics>) = 0
100 openat(AT_FDCWD</w>, "/bench-marker/cycle-1", O_RDONLY) = -1 ENOENT (No such file or directory)
102 openat(AT_FDCWD</w>, "/tmp/t/sys/x/mem_info_vram_used", O_RDONLY|O_CLOEXEC) = 6</tmp/t/sys/x/mem_info_vram_used>
102 fstat(5</tmp/t/sys/x/gpu_metrics>, {st_mode=S_IFREG|0444, st_size=120, ...}) = 0
102 pread64(5</tmp/t/sys/x/gpu_metrics>, ""..., 4096, 0) = 120
100 openat(AT_FDCWD</w>, "/bench-marker/cycle-end", O_RDONLY) = -1 ENOENT (No such file or directory)
100 exit_group(0) = ?
"""


def test_strace_log_splits_into_marked_cycles() -> None:
    cycles = list(split_cycles(STRACE_LOG.splitlines()))
    assert [c.cycle for c in cycles] == [0, 1, -1]
    first, second, _ = cycles
    assert first.opened == ["/tmp/t/sys/x/gpu_metrics"]
    assert first.reads == {"/tmp/t/sys/x/gpu_metrics": 2}
    assert first.syscalls == {"openat": 1, "futex": 1, "read": 2, "close": 1}
    assert second.opened == ["/tmp/t/sys/x/mem_info_vram_used"]
    # gpu_metrics read again through the descriptor kept from cycle 0: read, though not opened
    assert second.touched == ["/tmp/t/sys/x/mem_info_vram_used", "/tmp/t/sys/x/gpu_metrics"]
    assert first.touched == ["/tmp/t/sys/x/gpu_metrics"]


def test_strace_resumptions_are_not_counted_twice() -> None:
    assert parse_line("101 <... openat resumed>) = 5</x>") is None
    call = parse_line('7 openat(AT_FDCWD</w>, "/a/b", O_RDONLY <unfinished ...>')
    assert call is not None and (call.pid, call.name, call.path) == (7, "openat", "/a/b")


def test_rocm_smi_gpu_count_is_distinct_indices() -> None:
    output = "GPU[0]\t\t: Temperature (Sensor edge) (C): 40.0\nGPU[0]\t\t: x\nGPU[11]\t\t: y\nWARNING: GPU[3 bad\n"
    assert gcds_in_output(output) == 2


def test_nodelife_soak_runs_and_reports_its_figures(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from bench.nodelife import soak

    lines = soak(40, tmp_path, warm=10)  # the report's shape; the bench's own run warms up 1,000 cycles
    text = "\n".join(lines)
    assert "40 poll cycles" in text and "RSS" in text and "threads" in text and "open fds" in text
    assert "the hung one down: stuck" in text


def test_fastcost_report_states_each_ratio_against_its_goal() -> None:
    from bench.fastcost import report_table

    read = {"fast_read": 5e-6, "floor_read": 4e-6, "full_decode_read": 6e-5, "compiled_decode_read": 1.5e-5}
    sampler = {"gcds": 16, "cpu_per_sample": 3e-5, "core_share": 0.005, "ring_bytes_per_device": 25536}
    report = {
        "fleet": "8xMI250X",
        "read": read,
        "read_mi300": None,
        "sampler": sampler,
        "sampler_64": {"gcds": 64, "core_share": 0.01},
        "poll": {"hot": {"cpu_per_cycle": 1.3e-3, "floor": 3.4e-4}, "full": {"cpu_per_cycle": 6e-3, "floor": 2.5e-3}},
        "ratios": {
            "fast_read_vs_floor": 1.25,
            "full_decode_read_vs_floor": 15.0,
            "compiled_decode_read_vs_floor": 3.75,
            "fast_sampler_core_percent": 0.5,
            "fast_sampler_per_gcd_64_vs_16": 0.5,
            "poll_hot_vs_floor": 3.82,
            "poll_full_vs_floor": 2.4,
            "poll_daemon_average_vs_floor": 3.2,
        },
    }
    lines = report_table(report)
    assert len({len(line) for line in lines}) == 1  # an aligned markdown table
    fast = next(line for line in lines if line.startswith("| one fast read"))
    assert "1.25x" in fast and "<= 2x" in fast and "| yes" in fast
    hot = next(line for line in lines if "hot (between slow refreshes)" in line)
    assert "3.8x" in hot and "**NO**" in hot
