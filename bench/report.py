"""Formatting: markdown tables, human units, and the machine description. Pure functions."""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] = ()) -> str:
    """A markdown table padded to column width (readable as plain text too).

    `right[i]` right-aligns column i (numbers); columns default to left alignment.
    """
    width = [len(h) for h in headers]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, the table has {len(headers)} columns: {row!r}")
        width = [max(w, len(cell)) for w, cell in zip(width, row, strict=True)]
    aligned = [bool(right[i]) if i < len(right) else False for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, width, aligned, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if r else ("-" * (w + 2)) for w, r in zip(width, aligned, strict=True))
    return "\n".join([line(headers), rule + "|", *(line(row) for row in rows)])


def seconds(value: float | None) -> str:
    """A duration with a unit that keeps three significant figures: 412 µs, 3.07 ms, 1.20 s."""
    if value is None:
        return "n/a"
    if value < 0:
        return "-" + seconds(-value)
    if value == 0:
        return "0"
    if value < 1e-3:
        return _sig(value * 1e6) + " µs"
    if value < 1.0:
        return _sig(value * 1e3) + " ms"
    return _sig(value) + " s"


def ratio(value: float | None) -> str:
    """A ratio: 57x, 0.93x, 1/310."""
    if value is None:
        return "n/a"
    if value >= 1.0:
        return _sig(value) + "x"
    if value <= 0:
        return "0x"
    if value >= 0.1:
        return f"{value:.2f}x"
    return "1/" + _sig(1.0 / value)


def megabytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1e6:.1f} MB"


def number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 10**digits:
        return f"{value:,.0f}"
    return _sig(value, digits)


def _sig(value: float, digits: int = 3) -> str:
    if value == 0:
        return "0"
    text = f"{value:.{digits}g}"
    if "e" in text:  # 1.23e+03 -> 1230
        text = f"{value:.0f}"
    return text


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "**NO**")


def machine_description() -> list[tuple[str, str]]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory = ""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            first = handle.readline().split()
            memory = f"{int(first[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    return [
        ("date (UTC)", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")),
        ("cpu", f"{cpu} x {os.cpu_count()} logical"),
        ("memory", memory),
        ("kernel", platform.release()),
        ("os", _os_release()),
        ("python", platform.python_version()),
    ]


def load_average() -> str:
    """Other work on the machine skews every CPU figure: the report shows how busy it was."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def _os_release() -> str:
    try:
        with open("/etc/os-release", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()
