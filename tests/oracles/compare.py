"""Value-by-value comparison of one tool's report for one GPU with what the exporter serves.

A Comparison walks a tool's report flattened to "path -> value" and accounts for every value the
tool reports: either it is compared with our series (after unit conversion), or it is listed as
something we do not export, with the reason. A value that is neither is itself a failure, so a
new field in a tool release cannot be silently ignored. "N/A" and missing values are the tool
not reporting; there is nothing to compare.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.harness import Series, value

NOT_AVAILABLE = "N/A"


def flatten(report: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": [1, {"value": 5, "unit": "W"}]}} -> {"a.b[0]": 1, "a.b[1]": 5, "a.b[1]@unit": "W"}."""
    flat: dict[str, Any] = {}
    if isinstance(report, dict):
        if set(report) == {"value", "unit"}:
            flat[prefix] = report["value"]
            flat[prefix + "@unit"] = report["unit"]
            return flat
        for key, value in report.items():
            flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(report, list):
        for index, value in enumerate(report):
            flat.update(flatten(value, f"{prefix}[{index}]"))
    else:
        flat[prefix] = report
    return flat


def reported(value: Any) -> bool:
    if value is None:
        return False
    return not (isinstance(value, str) and (not value.strip() or value.strip().startswith(NOT_AVAILABLE)))


@dataclass
class OurDevice:
    """One GPU as the exporter serves it: its /metrics series and its /api/v1/devices identity."""

    gpu: str
    info: dict[str, str]  # amdgpu_device_info labels
    identity: dict[str, Any]
    series: Series

    def value(self, name: str, **labels: str) -> float | None:
        return value(self.series, name, gpu=self.gpu, **labels)

    @property
    def secondary_die(self) -> bool:
        return self.info.get("die", "0") != "0"

    def firmware(self, block: str) -> int | None:
        version = self.identity.get("firmware", {}).get(block)
        return int(version, 16) if version else None


@dataclass
class Comparison:
    tool: str
    device: str  # PCI bus id, for messages
    values: dict[str, Any]
    checked: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    compared: int = 0

    def tool_value(self, key: str) -> Any | None:
        value = self.values.get(key)
        return value if reported(value) else None

    def check(
        self,
        key: str,
        ours: Any,
        convert: Callable[[Any], Any] = float,
        unit: str | None = None,
        tolerance: float = 0.0,
    ) -> None:
        """The tool's value at key, converted to our unit, must equal ours."""
        self.checked.add(key)
        if unit is not None and key + "@unit" in self.values:
            self.checked.add(key + "@unit")
            if self.values[key + "@unit"] != unit:
                self.problems.append(f"{key}: unit {self.values[key + '@unit']!r}, expected {unit!r}")
        theirs = self.tool_value(key)
        if theirs is None:
            return
        if ours is None:
            self.problems.append(f"{key}: {self.tool} reports {theirs!r}, we export nothing")
            return
        try:
            converted = convert(theirs)
        except (TypeError, ValueError) as error:
            self.problems.append(f"{key}: cannot read {theirs!r} ({error})")
            return
        self.compared += 1
        if isinstance(converted, float) and isinstance(ours, float | int) and tolerance:
            equal = math.isclose(converted, float(ours), rel_tol=tolerance)
        else:
            equal = converted == ours
        if not equal:
            self.problems.append(f"{key}: {self.tool} {theirs!r} -> {converted!r}, ours {ours!r}")

    def expect(self, key: str, condition: bool, message: str) -> None:
        """A tool value we compare by a rule (a known tool quirk, a derived value)."""
        self.checked.add(key)
        if self.tool_value(key) is None:
            return
        self.compared += 1
        if not condition:
            self.problems.append(f"{key}: {message} (tool says {self.values[key]!r})")

    def not_exported(self, patterns: Iterable[str]) -> None:
        """Values we deliberately do not export (reasons are in the caller's table)."""
        for pattern in patterns:
            regex = re.compile(pattern)
            self.checked.update(key for key in self.values if regex.fullmatch(key))

    def finish(self) -> None:
        unaccounted = sorted(key for key, value in self.values.items() if key not in self.checked and reported(value))
        if unaccounted:
            self.problems.append(
                f"reported by {self.tool} but neither compared nor listed as not exported: {unaccounted}"
            )
        assert not self.problems, f"{self.tool} vs us on {self.device}:\n  " + "\n  ".join(self.problems)
        assert self.compared > 0, f"{self.tool} reported nothing we could compare on {self.device}"


def mhz(text: Any) -> float:
    """'(1700Mhz)' or 1700 -> 1.7e9 Hz."""
    if isinstance(text, str):
        text = text.strip("()").removesuffix("Mhz").removesuffix("MHz")
    return float(text) * 1e6


def firmware_parser(dotted_base: int) -> Callable[[Any], int]:
    """A firmware version as a tool prints it -> the kernel's 32-bit value.

    Hex "0x0110101b"; dotted bytes, decimal in rocm-smi ("27.00.01.22") and hex in amd-smi
    ("1B.00.01.16"); or a plain decimal number ("76").
    """

    def parse(text: Any) -> int:
        text = str(text)
        if text.startswith("0x"):
            return int(text, 16)
        if "." in text:
            return int.from_bytes(bytes(int(part, dotted_base) for part in text.split(".")), "big")
        return int(text)

    return parse
