"""The health verdict: is each GPU fit to run a job, and if not, which checks fail and on what evidence.

Pure: (previous verdict, snapshot, thresholds, node, now) -> the new HealthVerdict. A GPU is fit
when none of its checks fails; every check reads the GPU's own fault records (the Sample's health
signals) and clears by a rule once its cause is gone, so nothing latches: a counter fails while it
grows by its threshold within a trailing window and clears once a window passes without that much
growth; a record or a reset fails while it is younger than its window; a held condition (a link
down or trained below its maximum, a thermal throttle) fails once it has held for its `for` and
clears as soon as it stops. A device that cannot be read is never fit (device_down): the evidence
of its other checks stays as it was until it can be read again. docs/health.md says what each
check reads, its threshold and when it clears.

Counter windows are measured on the monotonic clock (Snapshot.monotonic_at), so a step of the wall
clock neither fires nor clears them; a CPER record's and a reset's age are measured on the wall
clock (`now`, by default Snapshot.taken_at), the only clock the driver stamps them with.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from exporter.model import (
    DRAIN_MARKER,
    DeviceState,
    GpuHealth,
    HealthCheck,
    HealthVerdict,
    Sample,
    Snapshot,
    frozen_map,
)

SEVERITIES = ("warning", "critical")
TAINT_KEY = "amd.com/gpu-unhealthy"


@dataclass(frozen=True, slots=True)
class CheckThresholds:
    """What makes one check fail (each check reads the keys CHECKS lists for it, docs/health.md)."""

    severity: str = "critical"
    enabled: bool = True
    threshold: float = 1.0  # errors, records or pages in the window; for bad_pages_threshold a ratio 0..1
    window_seconds: float = 3600.0  # the trailing window of a counter, or how old a record or reset may be
    for_seconds: float = 0.0  # how long a condition must hold before it fails
    reasons: tuple[str, ...] = ()  # throttling_persistent: the throttle reasons that count


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Every check's thresholds (the rule file's `health:` section), with per-ASIC overrides."""

    checks: Mapping[str, CheckThresholds] = field(default_factory=frozen_map)
    asic_overrides: Mapping[tuple[str, str], CheckThresholds] = field(default_factory=frozen_map)  # (asic, check)
    advice_for_seconds: float = 3600.0  # the undo commands stay this long after the last unfit verdict

    def of(self, check: str, asic: str) -> CheckThresholds:
        return self.asic_overrides.get((asic, check)) or self.checks.get(check) or CheckThresholds()


# check -> the rule-file keys it reads (besides severity; `enabled` for all but device_down), in
# /metrics and docs order. A check missing from a rule file takes the shipped file's values.
CHECKS: Mapping[str, tuple[str, ...]] = {
    "device_down": (),
    "ecc_uncorrectable": ("threshold", "window"),
    "ecc_deferred": ("threshold", "window"),
    "ecc_correctable_rate": ("threshold", "window"),
    "bad_pages_threshold": ("threshold",),
    "bad_pages_pending": ("threshold",),
    "cper_fatal": ("threshold", "window"),
    "cper_nonfatal": ("threshold", "window"),
    "cper_corrected": ("threshold", "window"),
    "gpu_reset": ("window",),
    "pcie_aer_fatal": ("threshold", "window"),
    "pcie_aer_nonfatal": ("threshold", "window"),
    "pcie_aer_correctable_rate": ("threshold", "window"),
    "xgmi_link_down": ("for",),
    "xgmi_errors": ("threshold", "window"),
    "pcie_link_degraded": ("for",),
    "throttling_persistent": ("for", "reasons"),
}

# A counter's history keeps a point per change, at most one per 1/_POINTS_PER_WINDOW of its window
# (a later change in that time moves the newest point): about that many points per counter. A check
# clears one window after the last growth; a rate check may count up to that fraction of a window more.
_POINTS_PER_WINDOW = 16


# --- the counters the counter checks watch (a Sample -> the count of each key: RAS block, AER port) ---

_ECC_CHECKS = {"uncorrectable": "ecc_uncorrectable", "deferred": "ecc_deferred", "correctable": "ecc_correctable_rate"}
_AER_CHECKS = {"fatal": "pcie_aer_fatal", "nonfatal": "pcie_aer_nonfatal", "correctable": "pcie_aer_correctable_rate"}
# check -> what it counts, in the order the checks are judged
_COUNTERS: Mapping[str, str] = {
    "ecc_uncorrectable": "uncorrectable ECC errors",
    "ecc_deferred": "deferred ECC errors",
    "ecc_correctable_rate": "correctable ECC errors",
    "pcie_aer_fatal": "fatal PCIe AER errors",
    "pcie_aer_nonfatal": "non-fatal PCIe AER errors",
    "pcie_aer_correctable_rate": "correctable PCIe AER errors",
    "xgmi_errors": "XGMI error events",
}


def _counter_counts(sample: Sample) -> dict[str, dict[str, float]]:
    """Every counter check's counts of one Sample (key -> count; {} when unreadable), in one pass
    over each of its mappings."""
    counts: dict[str, dict[str, float]] = {check: {} for check in _COUNTERS}
    for (block, kind), count in sample.ecc_errors.items():
        if (check := _ECC_CHECKS.get(kind)) is not None:
            counts[check][block] = float(count)
    for (port, severity), count in sample.pcie_aer_errors.items():
        if (check := _AER_CHECKS.get(severity)) is not None:
            counts[check][port] = float(count)
    if sample.xgmi_error_events is not None:
        counts["xgmi_errors"][""] = float(sample.xgmi_error_events)
    return counts


_NONE: Mapping[str, float] = frozen_map()
_CPER = {"cper_fatal": "fatal", "cper_nonfatal": "nonfatal", "cper_corrected": "corrected"}


def _duration(seconds: float) -> str:
    """90 -> '90s', 3600 -> '1h', 5400 -> '1h30m': how the rule file spells a window."""
    seconds = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return "".join(parts)


def _count(value: float) -> str:
    return f"{value:g}"


class _Gpu:
    """The evaluation of one GPU: the previous cycle's memory in, this cycle's verdict out."""

    def __init__(
        self,
        state: DeviceState,
        previous: GpuHealth | None,
        thresholds: HealthThresholds,
        now: float,
        monotonic: float,
        linked: frozenset[int] = frozenset(),
        limits: Mapping[str, CheckThresholds] | None = None,
    ) -> None:
        self.state = state
        self.linked = linked  # the XGMI link slots up on some GPU of the node
        self.previous = previous
        self.thresholds = thresholds
        self.asic = state.identity.asic
        self.now = now
        self.monotonic = monotonic
        self.failing: dict[str, tuple[str, float | None]] = {}  # check -> (reason, evidence's time)
        self.counters: dict[str, tuple[tuple[float, float], ...]] = dict(previous.counters) if previous else {}
        self.last_counts_before = previous.last_counts if previous is not None else frozen_map()
        self.last_counts: dict[str, Mapping[str, float]] = {}
        self.first_seen_before = previous.first_seen if previous is not None else frozen_map()
        self.first_seen: dict[str, float] = {}
        self.held: dict[str, tuple[float, float]] = {}
        self.residency: dict[str, float] = {}
        # every check's thresholds for this ASIC (made once per evaluation and ASIC by evaluate_health)
        self.limits = limits if limits is not None else _limits_of(thresholds, self.asic)

    def of(self, check: str) -> CheckThresholds:
        return self.limits[check]

    def fail(self, check: str, reason: str, at: float | None = None) -> None:
        self.failing[check] = (reason, at)

    # -- counters --

    def counter(self, check: str, what: str, counts: dict[str, float]) -> None:
        """Judge one counter check on the growth of each of its keys (RAS block, AER port), added up.

        A key read before and missing now is unreadable (a `Query currently inaccessible`, an
        implausible value rejected): it keeps its last good count and adds nothing, so neither a read
        that fails nor the one after it moves the check. A key that reads lower than before was reset
        (a driver reload): what it reads now is growth since the reset (as Prometheus's increase()
        takes it), so a flap down and back never clears a failing check early nor counts twice in
        reverse. The check's history is the running total of that growth."""
        before = self.last_counts_before.get(check, _NONE)
        if not counts and not before:
            self.counters.pop(check, None)
            return
        history = self.counters.get(check, ())
        total = history[-1][1] if history else 0.0
        if counts == before:  # the common case: nothing moved, every key read
            last: Mapping[str, float] = before
        else:
            last = dict(before)
            for key, value in counts.items():
                was = last.get(key)
                if was is not None:
                    total += value - was if value >= was else value
                last[key] = value
            last = frozen_map(last)
        self.last_counts[check] = last
        unreadable = sorted(key for key in last if key not in counts) if len(last) > len(counts) else []
        limits = self.of(check)
        window = limits.window_seconds
        points: tuple[tuple[float, float], ...] | list[tuple[float, float]] = history
        if not history or total != history[-1][1]:
            # A point per change; a change within 1/_POINTS_PER_WINDOW of a window of the point before the
            # newest moves the newest (to now: the growth leaves the window no earlier than it should).
            points = list(history)
            if len(points) >= 2 and self.monotonic - points[-2][0] < window / _POINTS_PER_WINDOW:
                points[-1] = (self.monotonic, total)
            else:
                points.append((self.monotonic, total))
        # The baseline: the newest point at least a window old, else the first one seen.
        start = self.monotonic - window
        old = [i for i, (t, _v) in enumerate(points) if t <= start]
        if old and old[-1]:
            points = points[old[-1] :]
        self.counters[check] = tuple(points)
        grown = total - points[0][1]
        if limits.enabled and grown >= limits.threshold:
            seen = "since the exporter started reading it" if not old else f"within {_duration(window)}"
            detail = ", ".join(f"{key} {_count(value)}" for key, value in sorted(last.items()) if key)
            if unreadable:
                detail += f"; unreadable now, its last count kept: {', '.join(unreadable)}"
            detail = f"{_count(sum(last.values()))} in all" + (f": {detail}" if detail else "")
            self.fail(
                check,
                f"{_count(grown)} {what} {seen} ({detail}); the threshold is {_count(limits.threshold)} "
                f"within {_duration(window)}",
            )

    # -- held conditions --

    def hold(self, check: str, condition: str, holds: bool, reason: str) -> None:
        if not holds:
            return
        before = self.previous.held.get(condition) if self.previous is not None else None
        since = before if before is not None else (self.monotonic, self.now)
        self.held[condition] = since
        limits = self.of(check)
        held_for = self.monotonic - since[0]
        if limits.enabled and held_for >= limits.for_seconds:
            self.fail(
                check, f"{reason} for {_duration(held_for)} (fails after {_duration(limits.for_seconds)})", since[1]
            )

    # -- the checks of a GPU that was read --

    def read(self, sample: Sample) -> None:
        counts = _counter_counts(sample)
        for check, what in _COUNTERS.items():
            self.counter(check, what, counts[check])
        self.bad_pages(sample)
        for check, severity in _CPER.items():
            self.cper(check, severity, sample)
        self.reset(sample)
        # A link slot down on every GPU of the node has no peer (a partial hive, the slot an 8-GPU
        # board leaves unused): only a slot that is up on another GPU counts.
        down = sorted(link for link, up in sample.xgmi_link_up.items() if not up and link in self.linked)
        self.hold("xgmi_link_down", "xgmi_link_down", bool(down), f"XGMI link {', '.join(map(str, down))} down")
        self.pcie(sample)
        self.throttle(sample)

    def bad_pages(self, sample: Sample) -> None:
        retired, threshold = sample.ras_retired_pages, sample.ras_bad_page_threshold
        limits = self.of("bad_pages_threshold")
        if limits.enabled and retired is not None and threshold and retired >= limits.threshold * threshold:
            self.fail(
                "bad_pages_threshold",
                f"{retired} retired VRAM pages of the driver's bad-page threshold {threshold} "
                f"(fails at {limits.threshold:.0%} of it: the board is at or near its RMA point)",
            )
        pending = sample.ras_pending_pages
        limits = self.of("bad_pages_pending")
        if limits.enabled and pending is not None and pending >= limits.threshold:
            self.fail(
                "bad_pages_pending",
                f"{pending} VRAM pages found bad and not yet retired (retired at the next GPU reset)",
            )

    def when(self, evidence: str, timestamp: float) -> float:
        """The time to age evidence by: its own, unless it has none (0: a CPER record without the
        timestamp-valid bit) or it lies ahead of now (a record dated 2099, a reset after now): then the
        time it was first seen, so its age is never negative and it ages from there like any other."""
        if 0 < timestamp <= self.now:
            return timestamp
        seen = self.first_seen_before.get(evidence, self.now)
        self.first_seen[evidence] = seen
        return seen

    def cper(self, check: str, severity: str, sample: Sample) -> None:
        limits = self.of(check)
        records = [r for r in sample.cper_records if r.severity == severity]
        if not limits.enabled or not records:
            return
        now = self.now
        times = [
            r.timestamp
            if 0 < r.timestamp <= now
            else self.when(f"cper {severity} {r.record_id} {r.timestamp:.0f}", 0.0)
            for r in records
        ]
        recent = [(t, r) for t, r in zip(times, records, strict=True) if self.now - t < limits.window_seconds]
        if len(recent) >= limits.threshold and recent:
            newest_at, newest = max(recent, key=lambda pair: pair[0])
            afids = sorted({afid for _t, r in recent for afid in r.afids})
            untimed = sum(1 for _t, r in recent if not 0 < r.timestamp <= self.now)
            self.fail(
                check,
                f"{len(recent)} {severity} CPER record{'s' if len(recent) != 1 else ''} within "
                f"{_duration(limits.window_seconds)}, the newest {_duration(self.now - newest_at)} old"
                + (f" (AFID {', '.join(map(str, afids))})" if afids else "")
                + (f", record {newest.record_id}" if newest.record_id else "")
                + (f"; {untimed} without a usable time, aged from when first seen" if untimed else ""),
                min(t for t, _r in recent),
            )

    def reset(self, sample: Sample) -> None:
        limits = self.of("gpu_reset")
        if sample.last_reset_at is None:
            return
        at = self.when(f"reset {sample.last_reset_at:.0f}", sample.last_reset_at)
        if limits.enabled and self.now - at < limits.window_seconds:
            self.fail(
                "gpu_reset",
                f"the GPU was reset {_duration(self.now - at)} ago (fails for {_duration(limits.window_seconds)} "
                "after a reset)"
                + ("; its time lies ahead, aged from when first seen" if at != sample.last_reset_at else ""),
                at,
            )

    def pcie(self, sample: Sample) -> None:
        speed, top_speed = sample.pcie_link_transfers_per_second, sample.pcie_max_link_transfers_per_second
        width, top_width = sample.pcie_link_width, sample.pcie_max_link_width
        slow = speed is not None and top_speed is not None and speed < top_speed
        narrow = width is not None and top_width is not None and width < top_width
        if slow or narrow:
            trained = f"{_count((speed or 0) / 1e9)} GT/s x{width}"
            best = f"{_count((top_speed or 0) / 1e9)} GT/s x{top_width}"
            self.hold("pcie_link_degraded", "pcie_link_degraded", True, f"PCIe link trained at {trained} of {best}")

    def throttle(self, sample: Sample) -> None:
        reasons = self.of("throttling_persistent").reasons
        active = {reason for reason, on in sample.throttle.items() if on and reason in reasons}
        previous = self.previous.residency if self.previous is not None else {}
        for reason, seconds in sample.throttle_residency_seconds.items():
            if reason in reasons:
                self.residency[reason] = seconds
                # Throttled during the last cycle: the firmware's residency grew since the last read.
                if reason in previous and seconds > previous[reason]:
                    active.add(reason)
        # One condition: some listed reason held the clocks back in every cycle since it started.
        names = ", ".join(sorted(active))
        self.hold("throttling_persistent", "throttling_persistent", bool(active), f"clocks held back by {names}")

    # -- the verdict --

    def verdict(self) -> GpuHealth:
        before = {c.check: c for c in self.previous.checks} if self.previous is not None else {}
        checks = []
        for check in CHECKS:
            if check not in self.failing:
                continue
            reason, at = self.failing[check]
            kept = before.get(check)
            since = kept.since if kept is not None else (at if at is not None else self.now)
            checks.append(HealthCheck(check, self.of(check).severity, reason, since))
        return GpuHealth(
            gpu=self.state.gpu,
            device_key=self.state.identity.key,
            checks=tuple(checks),
            counters=frozen_map(self.counters),
            held=frozen_map(self.held),
            residency=frozen_map(self.residency),
            last_counts=frozen_map(self.last_counts),
            first_seen=frozen_map(self.first_seen),
        )


def _down(state: DeviceState, previous: GpuHealth | None, thresholds: HealthThresholds, now: float) -> GpuHealth:
    """An unreadable GPU: device_down, and the evidence of its other checks as it was (nothing can clear
    it unread); the memory is kept, so its counters continue from where they were when it comes back."""
    why = state.down_reason or "unknown"
    reason = (
        "the device is gone from the bus (no longer discovered; forgotten 10 minutes after it went)"
        if not state.present
        else f"the device cannot be read ({why}); its other checks keep their last evidence"
    )
    kept = [c for c in previous.checks if c.check != "device_down"] if previous is not None else []
    old = next((c for c in previous.checks if c.check == "device_down"), None) if previous is not None else None
    severity = thresholds.of("device_down", state.identity.asic).severity
    down = HealthCheck("device_down", severity, reason, old.since if old is not None else now)
    order = list(CHECKS)
    checks = sorted([down, *kept], key=lambda c: order.index(c.check) if c.check in order else len(order))
    if previous is None:
        return GpuHealth(gpu=state.gpu, device_key=state.identity.key, checks=tuple(checks))
    return GpuHealth(
        gpu=state.gpu,
        device_key=state.identity.key,
        checks=tuple(checks),
        counters=previous.counters,
        held=frozen_map(),
        residency=previous.residency,
        last_counts=previous.last_counts,
        first_seen=previous.first_seen,
    )


def evaluate_health(
    previous: HealthVerdict | None,
    snapshot: Snapshot,
    thresholds: HealthThresholds,
    node: str = "",
    now: float | None = None,
) -> HealthVerdict:
    """The verdict on every device of the snapshot. `now` (unix seconds) defaults to the snapshot's taken_at."""
    wall = snapshot.taken_at if now is None else now
    before = {gpu.device_key: gpu for gpu in previous.gpus} if previous is not None else {}
    linked = frozenset(
        link
        for state in snapshot.devices
        if state.up and state.sample is not None
        for link, up in state.sample.xgmi_link_up.items()
        if up
    )
    gpus = []
    limits: dict[str, Mapping[str, CheckThresholds]] = {}  # ASIC -> its thresholds of every check
    for state in snapshot.devices:
        old = before.get(state.identity.key)
        if not state.up or not state.present or state.sample is None:
            gpus.append(_down(state, old, thresholds, wall))
            continue
        asic = state.identity.asic
        if asic not in limits:
            limits[asic] = _limits_of(thresholds, asic)
        gpu = _Gpu(state, old, thresholds, wall, snapshot.monotonic_at, linked, limits[asic])
        gpu.read(state.sample)
        gpus.append(gpu.verdict())
    return _advise(_with_sockets(snapshot.devices, gpus), previous, thresholds, node, wall)


def _limits_of(thresholds: HealthThresholds, asic: str) -> dict[str, CheckThresholds]:
    return {check: thresholds.of(check, asic) for check in CHECKS}


def _with_sockets(states: tuple[DeviceState, ...], gpus: list[GpuHealth]) -> tuple[GpuHealth, ...]:
    """A compute partition > 0 of an MI300-class socket reads none of the socket-wide signals (ECC,
    pages, CPER, resets, PCIe, XGMI, throttling: partition 0 carries them), yet runs on the same
    hardware: it fails its socket's checks too, named as the socket's (not device_down: a partition
    that answers is read)."""
    sockets = {
        (state.identity.pci_bus_id, state.identity.unique_id): gpu
        for state, gpu in zip(states, gpus, strict=True)
        if state.identity.partition == 0
    }
    order = list(CHECKS)
    out = []
    for state, gpu in zip(states, gpus, strict=True):
        socket = sockets.get((state.identity.pci_bus_id, state.identity.unique_id))
        if state.identity.partition == 0 or socket is None or socket.fit:
            out.append(gpu)
            continue
        own = {c.check for c in gpu.checks}
        shared = [
            dataclasses.replace(c, reason=f"on its socket (partition 0, gpu {socket.gpu}): {c.reason}")
            for c in socket.checks
            if c.check != "device_down" and c.check not in own
        ]
        checks = sorted([*gpu.checks, *shared], key=lambda c: order.index(c.check))
        out.append(dataclasses.replace(gpu, checks=tuple(checks)))
    return tuple(out)


# --- what to run about it ---------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:;=+/()-]")


def _node(node: str) -> str:
    return shlex.quote(node) if node else "NODE"


def drain_reason(reason: str) -> str:
    """The reason as Slurm is given it: plain characters, at most 1000 (no quoting needed in a shell)."""
    return _UNSAFE.sub("", reason)[:1000]


def drain_command(node: str, reason: str) -> str:
    """Slurm: take the node out of scheduling; running jobs finish (the reason is kept in plain characters)."""
    return f'scontrol update nodename={_node(node)} state=drain reason="{drain_reason(reason)}"'


def resume_command(node: str) -> str:
    return f"scontrol update nodename={_node(node)} state=resume"


def taint_command(node: str, value: str) -> str:
    """Kubernetes: no new pods on the node (those running stay); the value names the unfit GPUs."""
    return f"kubectl taint node {_node(node)} {TAINT_KEY}={value}:NoSchedule --overwrite"


def untaint_command(node: str) -> str:
    return f"kubectl taint node {_node(node)} {TAINT_KEY}:NoSchedule-"


def _taint_value(unfit: tuple[GpuHealth, ...]) -> str:
    """A label value (at most 63 characters of [A-Za-z0-9._-]): the unfit GPUs, "gpu1.gpu3"."""
    value = ".".join(f"gpu{gpu.gpu}" for gpu in unfit)
    return value[:63].rstrip(".") or "unfit"


def _advise(
    gpus: tuple[GpuHealth, ...],
    previous: HealthVerdict | None,
    thresholds: HealthThresholds,
    node: str,
    now: float,
) -> HealthVerdict:
    unfit = tuple(gpu for gpu in gpus if not gpu.fit)
    if unfit:
        what = "; ".join(f"gpu {gpu.gpu}: {', '.join(c.check for c in gpu.checks)}" for gpu in unfit)
        reason = drain_reason(f"{DRAIN_MARKER} {what}")
        drain = drain_command(node, reason)
        taint = taint_command(node, _taint_value(unfit))
        return HealthVerdict(
            taken_at=now,
            node=node,
            gpus=gpus,
            suggestion=(
                f"GPU{'s' if len(unfit) > 1 else ''} not fit ({what}): take the node out of service "
                f"with `{drain}` (Slurm) or `{taint}` (Kubernetes); once every GPU is fit again, "
                f"`{resume_command(node)}` or `{untaint_command(node)}` undoes it"
            ),
            drain_command=drain,
            resume_command=resume_command(node),
            drain_reason=reason,
            taint_command=taint,
            untaint_command=untaint_command(node),
            unfit_at=now,
        )
    unfit_at = previous.unfit_at if previous is not None else None
    if unfit_at is not None and now - unfit_at < thresholds.advice_for_seconds:
        return HealthVerdict(
            taken_at=now,
            node=node,
            gpus=gpus,
            suggestion=(
                "every GPU is fit again: if the node was taken out of service for the earlier verdict, "
                f"`{resume_command(node)}` (Slurm) or `{untaint_command(node)}` (Kubernetes) puts it back"
            ),
            resume_command=resume_command(node),
            untaint_command=untaint_command(node),
            unfit_at=unfit_at,
        )
    return HealthVerdict(taken_at=now, node=node, gpus=gpus)


def unreadable(verdict: HealthVerdict) -> Iterator[tuple[int, str]]:
    """(gpu, reason) of every GPU whose device_down check fails: what /readyz names, from the verdict itself."""
    for gpu in verdict.gpus:
        for check in gpu.checks:
            if check.check == "device_down":
                yield gpu.gpu, check.reason
