"""Scenarios: what the GPUs are asked to do, as a pure function of (seed, GCD, elapsed seconds).

The physics (power, clocks, heat) that follows from this lives in physics.py. Here only the
demand: engine busy percentages, communication intensity and how much of the model is resident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

SCENARIOS: tuple[str, ...] = ("idle", "training", "thermal-excursion", "alternating")

# The faults a scenario can inject, each on one GCD (faults=KIND.GCD+...), active from fault_at for
# fault_for seconds and then recovering: what each one writes is in physics.py and render.py.
FAULT_KINDS: tuple[str, ...] = (
    "ecc_ce", "ecc_ue", "ecc_de", "bad_pages", "cper_fatal", "cper_nonfatal", "cper_corrected", "reset",
    "aer_correctable", "aer_nonfatal", "aer_fatal", "xgmi_down", "pcie_downtrain", "throttle",
)  # fmt: skip
FAULT_AT_S = 5.0  # default start of the faults
FAULT_FOR_S = 30.0  # default duration of the faults

TRAINING_WARMUP_S = 3.0  # model load before the first step
COMPUTE_FRACTION = 0.72  # share of a training step spent computing; the rest is all-reduce
ALTERNATING_WARMUP_S = 1.0
ALTERNATING_PERIOD_S = 0.8  # default step of the "alternating" scenario: compute, then communicate
HOTSPOT_TAU_S = 0.12  # how fast the hotspot follows the die power within a step

_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finaliser: a fast, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_unit(*parts: int) -> float:
    """A deterministic number in [0, 1) from integer parts."""
    h = 0x12345
    for p in parts:
        h = _mix(h ^ (p & _MASK64))
    return (h >> 11) / float(1 << 53)


@lru_cache(maxsize=1 << 16)
def _lattice(seed: int, stream: int, gcd: int, k: int) -> float:
    return hash_unit(seed, stream, gcd, k) * 2.0 - 1.0


def smooth_noise(seed: int, stream: int, gcd: int, t: float, scale: float) -> float:
    """Value noise in [-1, 1]: random at multiples of `scale` seconds, cosine-blended between."""
    x = t / scale
    k = math.floor(x)
    frac = x - k
    a = _lattice(seed, stream, gcd, k)
    b = _lattice(seed, stream, gcd, k + 1)
    w = (1.0 - math.cos(math.pi * frac)) * 0.5
    return a + (b - a) * w


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    period: float = 10.0  # training step length, s
    start: float = 30.0  # thermal-excursion: when cooling degrades, s
    hot: float = 120.0  # thermal-excursion: how long it stays degraded, s
    peak: float = 92.0  # thermal-excursion: junction peak, °C
    gpus: tuple[int, ...] = field(default=(0,))  # thermal-excursion: affected GCD indices
    duty: float = 0.6  # alternating: share of each step spent computing
    swing: float = 6.0  # alternating: junction swing within a step, peak to peak, °C
    window: float = 15.0  # alternating: the truth keeps min/max/mean over this many seconds
    tick: float = 0.0  # alternating: seconds between tree updates (0: period / 20)
    load: float = 1.0  # training kinds: dynamic power x load (above ~1.07 an MI300X runs into its PPT limit)
    xgmi_down: tuple[tuple[int, int], ...] = ()  # (GCD, link) XGMI links that go down at `down_at`
    down_at: float = 0.0
    faults: tuple[tuple[str, int], ...] = ()  # (kind, GCD): injected from fault_at for fault_for seconds
    fault_at: float = FAULT_AT_S
    fault_for: float = FAULT_FOR_S

    @property
    def trains(self) -> bool:
        return self.name in ("training", "thermal-excursion", "alternating")

    @property
    def fast(self) -> bool:
        """Values change within a second: the tree must be rewritten faster than once a second."""
        return self.name == "alternating"

    @property
    def compute_fraction(self) -> float:
        return self.duty if self.name == "alternating" else COMPUTE_FRACTION

    @property
    def warmup(self) -> float:
        return ALTERNATING_WARMUP_S if self.name == "alternating" else TRAINING_WARMUP_S

    @property
    def tick_interval(self) -> float:
        """Longest update interval that still shows every phase of the workload (inf: any)."""
        if not self.fast:
            return math.inf
        return self.tick if self.tick > 0 else self.period / 20.0

    def __str__(self) -> str:
        opts = [] if self.name == "idle" else [f"period={self.period:g}"]
        if self.name == "thermal-excursion":
            opts += [f"start={self.start:g}", f"hot={self.hot:g}", f"peak={self.peak:g}"]
            opts.append("gpus=" + "+".join(str(g) for g in self.gpus))
        if self.name == "alternating":
            opts += [f"duty={self.duty:g}", f"swing={self.swing:g}", f"window={self.window:g}"]
            if self.tick > 0:
                opts.append(f"tick={self.tick:g}")
        if self.load != 1.0:
            opts.append(f"load={self.load:g}")
        if self.xgmi_down:
            opts.append("xgmi_down=" + "+".join(f"{g}.{link}" for g, link in self.xgmi_down))
            opts.append(f"down_at={self.down_at:g}")
        if self.faults:
            opts.append("faults=" + "+".join(f"{kind}.{g}" for kind, g in self.faults))
            opts += [f"fault_at={self.fault_at:g}", f"fault_for={self.fault_for:g}"]
        return f"{self.name}:{','.join(opts)}" if opts else self.name

    def xgmi_link_down(self, gcd: int, link: int, t: float) -> bool:
        if link == 0 and self.fault_active("xgmi_down", gcd, t):
            return True
        return t >= self.down_at and (gcd, link) in self.xgmi_down

    def has_fault(self, kind: str, gcd: int) -> bool:
        return (kind, gcd) in self.faults

    def fault_active(self, kind: str, gcd: int, t: float) -> bool:
        """The fault is under way at t (from fault_at, for fault_for seconds)."""
        return (kind, gcd) in self.faults and self.fault_at <= t < self.fault_at + self.fault_for

    def fault_seconds(self, kind: str, gcd: int, t: float) -> float | None:
        """Seconds the fault has lasted by t (fault_for once it is over); None before it starts or
        when this GCD has no such fault. Counts that grow with it stop growing when it ends."""
        if (kind, gcd) not in self.faults or t < self.fault_at:
            return None
        return min(t - self.fault_at, self.fault_for)

    def step_phase(self, seed: int, gcd: int, t: float) -> float | None:
        """0..1 position within the current training step (None before the first step)."""
        if not self.trains or t < self.warmup:
            return None
        # all ranks step together (a collective ends each step); a rank's skew is tens of ms
        skew = 0.08 * (hash_unit(seed, 7, gcd) * 2.0 - 1.0)
        if self.fast:
            # a short step: skew by whole ticks, so every phase edge falls on a tree update and a
            # value written at a tick holds, unchanged in phase, until the next one
            tick = self.tick_interval
            skew = round(skew * min(1.0, self.period / 4.0) / tick) * tick
        return ((t - self.warmup + skew) % self.period) / self.period

    def hotspot_swing(self, seed: int, gcd: int, t: float) -> float:
        """°C the hotspot sits above (or below) its slow temperature at time t: the periodic
        first-order response (time constant HOTSPOT_TAU_S) to the compute/communication square
        wave, scaled so its peak-to-peak is `swing`. 0 outside the alternating scenario."""
        if self.name != "alternating":
            return 0.0
        phase = self.step_phase(seed, gcd, t)
        if phase is None:
            return 0.0
        high = self.duty * self.period
        low = self.period - high
        k_high, k_low = math.exp(-high / HOTSPOT_TAU_S), math.exp(-low / HOTSPOT_TAU_S)
        top = (1.0 - k_high) / (1.0 - k_high * k_low)  # response at the end of the compute phase
        bottom = top * k_low  # ... and at the end of the communication phase
        s = phase * self.period
        if s < high:
            y = 1.0 - (1.0 - bottom) * math.exp(-s / HOTSPOT_TAU_S)
        else:
            y = top * math.exp(-(s - high) / HOTSPOT_TAU_S)
        span = top - bottom
        return self.swing * ((y - bottom) / span - 0.5) if span > 0 else 0.0

    def excursion_weight(self, gcd: int, t: float) -> float:
        """0..1: how far a GCD's cooling has degraded under the thermal excursion at time t."""
        if self.name != "thermal-excursion" or gcd not in self.gpus:
            return 0.0
        ramp = max(0.5, min(10.0, self.hot / 4.0))
        rise = _smoothstep((t - self.start) / ramp)
        fall = 1.0 - _smoothstep((t - self.start - self.hot) / ramp)
        return min(rise, fall)


def _smoothstep(x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    return x * x * (3.0 - 2.0 * x)


_FAULT_OPTIONS = ("faults", "fault_at", "fault_for")
_OPTIONS = {
    "idle": _FAULT_OPTIONS,
    "training": ("period", "load", "xgmi_down", "down_at", *_FAULT_OPTIONS),
    "thermal-excursion": ("period", "start", "hot", "peak", "gpus", "load", "xgmi_down", "down_at", *_FAULT_OPTIONS),
    "alternating": ("period", "duty", "swing", "window", "tick", "load", "xgmi_down", "down_at", *_FAULT_OPTIONS),
}


def scenario_help() -> str:
    """The scenarios and each one's options, for --help (from _OPTIONS: nothing to keep in step)."""
    own = {name: [o for o in options if o not in _FAULT_OPTIONS] for name, options in _OPTIONS.items()}
    kinds = "; ".join(f"{name}: {', '.join(options)}" if options else name for name, options in own.items())
    kinds += f"; every one also: {', '.join(_FAULT_OPTIONS)}"
    return (
        f"{kinds} (NAME:KEY=VALUE,...: seconds for period/start/hot/window/tick/down_at, °C for peak/swing, "
        "duty 0.05-0.95, load a power factor, gpus=GCD+GCD (an MI250X has two GCDs, an MI300X socket is one), "
        f"xgmi_down=GCD.LINK+GCD.LINK, faults=KIND.GCD+KIND.GCD, KIND one of {', '.join(FAULT_KINDS)}: "
        f"from fault_at ({FAULT_AT_S:g} s unless given) for fault_for ({FAULT_FOR_S:g} s) seconds, then recovering; "
        "e.g. thermal-excursion:start=10,hot=60,gpus=0+3 or "
        "training:faults=ecc_ue.0+aer_fatal.1,fault_at=5,fault_for=20)"
    )


def parse_scenario(spec: str) -> Scenario:
    """Parse "idle", "training", "thermal-excursion:start=10,hot=60,gpus=0+3",
    "alternating:period=0.6,duty=0.5,swing=8"; ValueError if bad."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty scenario: expected one of {', '.join(SCENARIOS)}")
    name, _, opts = spec.strip().partition(":")
    name = name.strip()
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: expected one of {', '.join(SCENARIOS)}")
    values: dict[str, object] = {}
    for opt in (o for o in opts.split(",") if o.strip()):
        key, sep, raw = opt.partition("=")
        key, raw = key.strip(), raw.strip()
        if key not in _OPTIONS[name] or not sep:
            allowed = ", ".join(_OPTIONS[name]) or "none"
            raise ValueError(f"bad option {opt.strip()!r} for scenario {name!r}: options are {allowed}")
        if key == "gpus":
            try:
                gpus = tuple(int(g) for g in raw.split("+"))
            except ValueError:
                raise ValueError(f"bad gpus={raw}: expected GCD indices joined by '+', e.g. 0+3") from None
            if not gpus or min(gpus) < 0:
                raise ValueError(f"bad gpus={raw}: indices must be 0 or more")
            values[key] = gpus
            continue
        if key == "xgmi_down":
            try:
                links = tuple((int(gcd), int(link)) for gcd, link in (item.split(".") for item in raw.split("+")))
            except ValueError:
                raise ValueError(f"bad xgmi_down={raw}: expected GCD.LINK joined by '+', e.g. 0.3+2.5") from None
            if not links or any(g < 0 or not 0 <= link < 8 for g, link in links):
                raise ValueError(f"bad xgmi_down={raw}: GCD 0 or more, link 0..7")
            values[key] = links
            continue
        if key == "faults":
            values[key] = _parse_faults(raw)
            continue
        try:
            number = float(raw)
        except ValueError:
            raise ValueError(f"bad {key}={raw} for scenario {name!r}: expected a number") from None
        if not math.isfinite(number) or number < 0 or (key in ("period", "hot", "window", "fault_for") and number <= 0):
            raise ValueError(f"bad {key}={raw} for scenario {name!r}: out of range")
        if key == "duty" and not 0.05 <= number <= 0.95:
            raise ValueError(f"bad duty={raw}: the compute share of a step must be between 0.05 and 0.95")
        if key == "swing" and number > 30:
            raise ValueError(f"bad swing={raw}: a swing within one step is at most 30 °C")
        if name == "alternating" and key == "period" and not 0.1 <= number <= 60:
            raise ValueError(f"bad period={raw}: an alternating step lasts 0.1 to 60 s")
        if key == "load" and not 0.1 <= number <= 2:
            raise ValueError(f"bad load={raw}: the power factor must be 0.1 to 2")
        if key == "tick" and number != 0 and not 0.01 <= number <= 1:
            raise ValueError(f"bad tick={raw}: the update interval must be 0.01 to 1 s (0 = period / 20)")
        values[key] = number
    if name == "alternating" and "period" not in values:
        values["period"] = ALTERNATING_PERIOD_S
    scenario = Scenario(name, **values)  # type: ignore[arg-type]
    if scenario.peak <= 60 or scenario.peak >= 105:
        raise ValueError(f"bad peak={scenario.peak:g}: a junction peak must be between 60 and 105 °C")
    return scenario


def _parse_faults(raw: str) -> tuple[tuple[str, int], ...]:
    """faults=KIND.GCD+KIND.GCD -> ((kind, gcd), ...); ValueError if bad."""
    faults = []
    for item in raw.split("+"):
        kind, sep, gcd = item.strip().rpartition(".")
        if not sep or kind not in FAULT_KINDS or not gcd.isdigit():
            raise ValueError(
                f"bad faults={raw}: expected KIND.GCD joined by '+', e.g. ecc_ue.0+aer_fatal.1, "
                f"KIND one of {', '.join(FAULT_KINDS)}"
            )
        faults.append((kind, int(gcd)))
    return tuple(dict.fromkeys(faults))


@dataclass(frozen=True, slots=True)
class Demand:
    """What the workload asks of one GCD at one instant."""

    gfx: float  # % busy
    mem: float  # % busy
    comm: float  # 0..1 communication intensity (XGMI/PCIe traffic)
    load: float  # 0..1 share of the model resident in VRAM


IDLE = Demand(0.0, 0.0, 0.0, 0.0)


def demand(scenario: Scenario, seed: int, gcd: int, t: float) -> Demand:
    if not scenario.trains or t < 0:
        return IDLE
    warmup = scenario.warmup
    if t < warmup:
        # loading the model and the first batches: host-to-device copies
        return Demand(8.0 + 4.0 * smooth_noise(seed, 1, gcd, t, 0.7), 22.0, 0.35, t / warmup)
    phase = scenario.step_phase(seed, gcd, t)
    assert phase is not None
    n_gfx = smooth_noise(seed, 2, gcd, t, 0.9)
    n_mem = smooth_noise(seed, 3, gcd, t, 1.3)
    if phase < scenario.compute_fraction:
        return Demand(97.5 + 2.5 * n_gfx, 38.0 + 6.0 * n_mem, 0.04, 1.0)
    return Demand(30.0 + 12.0 * n_gfx, 72.0 + 8.0 * n_mem, 1.0, 1.0)
