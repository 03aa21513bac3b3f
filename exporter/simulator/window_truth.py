"""What the tree showed over a sliding window: the truth a sub-second sampler is held to.

Every tick of a fast scenario adds one point per device: the values just written (temperatures,
power, busy, clocks, as in truth()) and the accumulators behind them. A value holds from the tick
that wrote it to the next one, so over the window [now - W, now]:
- min / max are over every value shown in the window (the one shown at its start included);
- mean is time-weighted by how long each value was shown;
- where an accumulator exists the mean it implies is given too (mean_acc): power from energy
  (ΔJ / Δt), busy from the activity accumulators (Δ(%·s) / Δt / 100; per partition from its
  xcp_stats gfx_busy_acc). That is the exact mean of the underlying signal, whatever the sampling.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.simulator.physics import DieReading
from exporter.simulator.truth import SimulatedDevice

FAMILIES = ("temperature", "power", "busy", "clock")
_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class WindowPoint:
    values: Mapping[str, Mapping[str, float]]  # family -> key -> value (SI units, as in Sample)
    accumulators: Mapping[str, float]  # "energy_joules", "gfx_acc", "mem_acc" (%·s)


def window_point(device: SimulatedDevice, reading: DieReading) -> WindowPoint:
    s = device.sample
    values: dict[str, dict[str, float]] = {
        "temperature": dict(s.temperatures),
        "power": {"socket": s.power_watts} if s.power_watts is not None else {},
        "busy": dict(s.busy),
        "clock": dict(s.clocks_hertz),
    }
    acc: dict[str, float] = {}
    part = device.partition
    if s.energy_joules is not None:
        acc["energy_joules"] = s.energy_joules
    if (part is None or part.index == 0) and device.gpu_metrics is not None:
        # MI300-class: the table's socket accumulators
        acc["gfx_acc"] = float(reading.gfx_activity_acc)
        acc["mem_acc"] = float(reading.mem_activity_acc)
    if part is not None and part.count > 1 and part.gfx_busy_acc_per_xcc:
        # a partitioned socket: every partition's gfx busy is its own, partition 0's too
        acc["gfx_acc"] = float(part.gfx_busy_acc_per_xcc[0])
    return WindowPoint(values, acc)


class WindowHistory:
    """Ticks of the last `seconds` (plus the one shown when the window opens), bounded in memory."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self._ticks: deque[tuple[float, float, list[WindowPoint]]] = deque()  # (elapsed, wall, points)

    def add(self, elapsed: float, wall: float, points: list[WindowPoint]) -> None:
        if self._ticks and elapsed < self._ticks[-1][0]:
            self._ticks.clear()  # time went backwards (tick() re-run from an earlier point)
        self._ticks.append((elapsed, wall, points))
        start = elapsed - self.seconds
        # keep the newest tick at or before the window start: its value is shown when the window opens
        while len(self._ticks) > 1 and self._ticks[1][0] <= start:
            self._ticks.popleft()

    def __len__(self) -> int:
        return len(self._ticks)

    def stats(self) -> dict[str, Any]:
        """{seconds, elapsed, written_at, ticks, devices: [{gpu, family: {key: {min, max, mean[, mean_acc]}}}]}."""
        if not self._ticks:
            return {"seconds": self.seconds, "elapsed": None, "written_at": None, "ticks": 0, "devices": []}
        now, wall = self._ticks[-1][0], self._ticks[-1][1]
        start = now - self.seconds
        ticks = list(self._ticks)
        devices = []
        for gpu in range(len(ticks[-1][2])):
            devices.append({"gpu": gpu, **self._device(ticks, gpu, start, now)})
        return {"seconds": self.seconds, "elapsed": now, "written_at": wall, "ticks": len(ticks), "devices": devices}

    @staticmethod
    def _device(
        ticks: list[tuple[float, float, list[WindowPoint]]], gpu: int, start: float, now: float
    ) -> dict[str, dict[str, dict[str, float]]]:
        result: dict[str, dict[str, dict[str, float]]] = {family: {} for family in FAMILIES}
        for family in FAMILIES:
            keys = ticks[-1][2][gpu].values[family].keys()
            for key in keys:
                shown_values, weighted, total = [], 0.0, 0.0
                for i, (t, _wall, points) in enumerate(ticks):
                    value = points[gpu].values[family].get(key)
                    if value is None:
                        continue
                    end = ticks[i + 1][0] if i + 1 < len(ticks) else now
                    shown = min(end, now) - max(t, start)
                    if shown < 0 or (shown == 0 and i + 1 < len(ticks)):
                        continue
                    shown_values.append(value)
                    weighted += value * shown
                    total += shown
                if shown_values:
                    mean = weighted / total if total > 0 else shown_values[-1]
                    low, high = min(shown_values), max(shown_values)
                    # a constant value must not come out a rounding error outside its own range
                    result[family][key] = {"min": low, "max": high, "mean": min(high, max(low, mean))}
        first_t, last_t = ticks[0][0], ticks[-1][0]
        first, last = ticks[0][2][gpu].accumulators, ticks[-1][2][gpu].accumulators
        span = last_t - first_t
        if span > 0:
            if "energy_joules" in first and "energy_joules" in last and "socket" in result["power"]:
                result["power"]["socket"]["mean_acc"] = (last["energy_joules"] - first["energy_joules"]) / span
            for name, engine in (("gfx_acc", "gfx"), ("mem_acc", "memory")):
                if name in first and name in last and engine in result["busy"]:
                    delta = (last[name] - first[name]) % _U32
                    result["busy"][engine]["mean_acc"] = delta / span / 100.0
        return result
