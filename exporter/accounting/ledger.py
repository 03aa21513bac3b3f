"""Per-job accounting: what each job or pod used of its devices, accumulated cycle by cycle (pure).

`account(ledger, snapshot, health)` returns the next Ledger. A cycle's interval (the previous
cycle's instant to this one's) belongs to the holders the previous cycle saw: a job is seen from
the first cycle whose attribution names it (`started_at`) to the first that no longer does
(`ended_at`), and is charged every interval in between. Every figure of an interval comes from the
reads at its end; the energy is the package counter's increase over it (wrap- and reset-safe:
counters are already continued by pipeline/counters.py, and a drop is a reset: the interval counts
nothing), split among the package's dies or partitions by `split.shares`.

The interval after a daemon restart (from the state file's last cycle to the first new one) is one
interval like the others: its energy is the counter's increase across the gap, so a restart loses no
joule while the device's counter did not reset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.accounting.split import PackageShare, package_shares
from exporter.model import DeviceState, DeviceUsage, HealthVerdict, JobUsage, Sample, Snapshot, frozen_map

HISTORY_POINTS = 240  # per device and job: halved (every other point) when full, so a week fits too
BUSY_ENGINES = ("gfx", "memory")
PEAK_SENSORS = ("junction", "memory")
# The attribution source each scheduler's claims come from (a job of a source that is down is not ended)
SOURCE_OF = {"kubernetes": "kubernetes", "slurm": "slurm", "flux": "slurm", "pbs": "slurm"}

DeviceKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class Reading:
    """One device's counters at the last cycle accounted: what the next interval's increases start from."""

    energy_joules: float | None = None
    errors: Mapping[str, float] = field(default_factory=frozen_map)  # "ecc_uncorrectable", "pcie_replays", ...
    throttle_residency_seconds: Mapping[str, float] = field(default_factory=frozen_map)


@dataclass(frozen=True, slots=True)
class Ledger:
    """The accounting stage's state: running jobs, the ended ones kept, and the last cycle's counters."""

    running: tuple[JobUsage, ...] = ()
    ended: tuple[JobUsage, ...] = ()  # oldest first
    readings: Mapping[DeviceKey, Reading] = field(default_factory=frozen_map)
    taken_at: float | None = None  # unix seconds of the last cycle accounted

    def find(self, job_id: str) -> JobUsage | None:
        """The running job of this id, else the newest ended one."""
        for job in self.running:
            if job.job_id == job_id:
                return job
        return next((job for job in reversed(self.ended) if job.job_id == job_id), None)


@dataclass(frozen=True, slots=True)
class Limits:
    """How many ended jobs are kept, and for how long (the state file's bound)."""

    keep_seconds: float = 7 * 86400.0
    max_ended: int = 2000
    max_histories: int = 100  # ended jobs that keep their plots (the newest); older ones keep their figures


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Holder:
    """A job or pod as this cycle's attribution names it."""

    job_id: str
    scheduler: str
    labels: tuple[tuple[str, str], ...]
    gpus: tuple[int, ...]


def holders(snapshot: Snapshot) -> tuple[Holder, ...]:
    """Pure: every job or pod holding a device in this snapshot, with its gpus."""
    found: dict[tuple[str, str], tuple[dict[str, set[str]], set[int]]] = {}
    for allocation in snapshot.attribution.allocations:
        labels = dict(allocation.labels)
        if allocation.source == "kubernetes":
            if not labels.get("pod"):
                continue
            key = ("kubernetes", f"{labels.get('namespace', '')}/{labels['pod']}")
        else:
            if not labels.get("job_id"):
                continue
            scheduler = allocation.resource if allocation.resource in ("flux", "pbs") else allocation.source
            key = (scheduler, labels["job_id"])
        values, gpus = found.setdefault(key, ({}, set()))
        gpus.add(allocation.gpu)
        for name, value in allocation.labels:
            if value:
                values.setdefault(name, set()).add(value)
    return tuple(
        Holder(
            job_id, scheduler, tuple((n, ",".join(sorted(v))) for n, v in sorted(values.items())), tuple(sorted(gpus))
        )
        for (scheduler, job_id), (values, gpus) in sorted(found.items())
    )


def _counter_totals(sample: Sample) -> dict[str, float]:
    """The error counters a job is charged the increase of, by name."""
    totals: dict[str, float] = {}
    for (_block, kind), count in sample.ecc_errors.items():
        totals[f"ecc_{kind}"] = totals.get(f"ecc_{kind}", 0) + count
    for name in ("pcie_replays", "pcie_recoveries"):
        value = getattr(sample, name)
        if value is not None:
            totals[name] = value
    if sample.pcie_aer_errors:
        totals["pcie_aer"] = sum(sample.pcie_aer_errors.values())
    if sample.xgmi_error_events is not None:
        totals["xgmi_errors"] = sample.xgmi_error_events
    return totals


def _reading(sample: Sample) -> Reading:
    return Reading(sample.energy_joules, frozen_map(_counter_totals(sample)), sample.throttle_residency_seconds)


def _increases(now: Mapping[str, float], before: Mapping[str, float] | None) -> dict[str, float]:
    """Each counter's increase since the last reading; a drop is a reset (nothing counted), a new
    counter starts counting from its first reading."""
    if before is None:
        return {}
    return {name: value - before[name] for name, value in now.items() if name in before and value > before[name]}


@dataclass(frozen=True, slots=True)
class _Interval:
    """What one device did over one interval, as every job holding it is charged."""

    seconds: float
    energy_joules: float  # the device's share of its package's increase
    package_energy_joules: float  # the whole increase of the package's counter
    sample: Sample | None  # the device's own read at the interval's end
    socket: Sample | None  # where its socket-wide values are: its own sample, or its package lead's
    errors: Mapping[str, float]
    residency: Mapping[str, float]
    checks: tuple[str, ...]


def _intervals(
    ledger: Ledger, snapshot: Snapshot, health: HealthVerdict | None, seconds: float
) -> tuple[dict[int, _Interval], dict[DeviceKey, Reading]]:
    up = [d for d in snapshot.devices if d.up and d.sample is not None]
    shares: dict[int, PackageShare] = {share.gpu: share for share in package_shares(up, ledger.readings)}
    leads = {share.package: share.lead_gpu for share in shares.values()}
    by_gpu = {d.gpu: d for d in up}
    checks = {g.gpu: tuple(c.check for c in g.checks) for g in health.gpus} if health is not None else {}
    readings = dict(ledger.readings)
    intervals: dict[int, _Interval] = {}
    for state in up:
        sample = state.sample
        assert sample is not None
        lead = by_gpu.get(leads.get(_package(state), state.gpu), state)
        own = bool(sample.temperatures)
        socket_state = state if own else lead
        socket = socket_state.sample
        assert socket is not None
        before = ledger.readings.get(socket_state.identity.key)
        now = _reading(socket)
        share = shares.get(state.gpu)
        intervals[state.gpu] = _Interval(
            seconds=seconds,
            energy_joules=share.energy_joules if share is not None else 0.0,
            package_energy_joules=share.package_energy_joules if share is not None else 0.0,
            sample=sample,
            socket=socket,
            errors=frozen_map(_increases(now.errors, before.errors if before else None)),
            residency=frozen_map(
                _increases(now.throttle_residency_seconds, before.throttle_residency_seconds if before else None)
            ),
            checks=checks.get(state.gpu, ()),
        )
    for state in up:
        assert state.sample is not None
        readings[state.identity.key] = _reading(state.sample)
    return intervals, readings


def _package(state: DeviceState) -> str:
    return state.identity.package or state.identity.pci_bus_id


def _add(totals: Mapping[str, float], more: Mapping[str, float]) -> Mapping[str, float]:
    if not more:
        return totals
    merged = dict(totals)
    for name, value in more.items():
        merged[name] = merged.get(name, 0) + value
    return frozen_map(merged)


def _highest(peaks: Mapping[str, float], values: Mapping[str, float]) -> Mapping[str, float]:
    found = {name: values[name] for name in PEAK_SENSORS if name in values}
    if not found or all(peaks.get(name, -1e9) >= value for name, value in found.items()):
        return peaks
    return frozen_map({**peaks, **{n: max(v, peaks.get(n, v)) for n, v in found.items()}})


def _history(usage: DeviceUsage, point: tuple[float, float | None, float | None, float | None]) -> DeviceUsage:
    skipped = usage.history_skipped + 1
    if usage.history and skipped < usage.history_stride:
        return dataclasses.replace(usage, history_skipped=skipped)
    history, stride = (*usage.history, point), usage.history_stride
    if len(history) > HISTORY_POINTS:
        history, stride = history[::2], stride * 2
    return dataclasses.replace(usage, history=history, history_stride=stride, history_skipped=0)


def _charge(usage: DeviceUsage, interval: _Interval, taken_at: float, sharers: int) -> DeviceUsage:
    """The device's usage with one more interval; `sharers` jobs held the device over it (a shared GPU:
    its energy is split equally among them, so no joule is counted twice)."""
    seconds = interval.seconds
    usage = dataclasses.replace(usage, held_seconds=usage.held_seconds + seconds)
    sample, socket = interval.sample, interval.socket
    if sample is None or socket is None or seconds <= 0:
        return usage
    energy = interval.energy_joules / max(1, sharers)
    power = energy / seconds
    busy = {e: sample.busy[e] * seconds for e in BUSY_ENGINES if e in sample.busy}
    throttled = {reason: seconds for reason, active in socket.throttle.items() if active}
    throttled.update(interval.residency)
    vram = sample.memory_used_bytes.get("vram")
    changes = dataclasses.replace(
        usage,
        energy_joules=usage.energy_joules + energy,
        package_energy_joules=usage.package_energy_joules + interval.package_energy_joules,
        busy_seconds=_add(usage.busy_seconds, busy),
        peak_power_watts=power if usage.peak_power_watts is None else max(power, usage.peak_power_watts),
        peak_temperatures_celsius=_highest(usage.peak_temperatures_celsius, socket.temperatures),
        vram_peak_bytes=vram if usage.vram_peak_bytes is None or vram is None else max(vram, usage.vram_peak_bytes),
        throttled_seconds=_add(usage.throttled_seconds, throttled),
        errors=_add(usage.errors, interval.errors),  # type: ignore[arg-type]
        failed_checks=tuple(sorted({*usage.failed_checks, *interval.checks})),
    )
    point = (round(taken_at, 3), round(power, 1), sample.busy.get("gfx"), socket.temperatures.get("junction"))
    return _history(changes, point)


def place(state: DeviceState, shared: bool) -> str:
    """Where on its package a device is: "partition 3" (a partitioned socket), "die 1" (a package
    of several dies), "" (a whole GPU)."""
    identity = state.identity
    if identity.compute_partition not in ("", "SPX") or identity.partition:
        return f"partition {identity.partition}"
    return f"die {identity.die}" if shared or identity.die else ""


def _new_usage(state: DeviceState, shared: bool) -> DeviceUsage:
    identity = state.identity
    return DeviceUsage(
        place=place(state, shared),
        gpu=state.gpu,
        device_key=identity.key,
        package=_package(state),
        die=identity.die,
        partition=identity.partition,
        product=identity.product,
    )


def _advance(
    job: JobUsage,
    intervals: Mapping[int, _Interval],
    states: Mapping[int, DeviceState],
    sharers: Mapping[int, int],
    shared_packages: Mapping[int, bool],
    seconds: float,
    taken_at: float,
) -> JobUsage:
    """The running job charged with this cycle's interval on every device it held at the last cycle."""
    devices = {usage.gpu: usage for usage in job.devices}
    for gpu in job.held_gpus:
        usage = devices.get(gpu)
        if usage is None:
            state = states.get(gpu)
            if state is None:
                continue
            shared = shared_packages.get(gpu, False)
            usage = _new_usage(state, shared)
        interval = intervals.get(gpu) or _Interval(seconds, 0.0, 0.0, None, None, frozen_map(), frozen_map(), ())
        devices[gpu] = _charge(usage, interval, taken_at, sharers.get(gpu, 1))
    return dataclasses.replace(job, devices=tuple(devices[g] for g in sorted(devices)), updated_at=taken_at)


def account(
    ledger: Ledger, snapshot: Snapshot, health: HealthVerdict | None = None, limits: Limits = DEFAULT_LIMITS
) -> tuple[Ledger, tuple[JobUsage, ...]]:
    """Pure: the ledger after this snapshot, and the jobs that ended with it."""
    taken_at = snapshot.taken_at
    seconds = max(0.0, taken_at - ledger.taken_at) if ledger.taken_at is not None else 0.0
    intervals, readings = _intervals(ledger, snapshot, health, seconds)
    states = {d.gpu: d for d in snapshot.devices}
    members: dict[str, int] = {}
    for state in snapshot.devices:
        members[_package(state)] = members.get(_package(state), 0) + 1
    shared = {gpu: members[_package(state)] > 1 for gpu, state in states.items()}
    sharers: dict[int, int] = {}
    for job in ledger.running:
        for gpu in job.held_gpus:
            sharers[gpu] = sharers.get(gpu, 0) + 1
    charged = (
        [_advance(job, intervals, states, sharers, shared, seconds, taken_at) for job in ledger.running]
        if seconds
        else list(ledger.running)
    )
    now = {(h.scheduler, h.job_id): h for h in holders(snapshot)}
    sources_up = snapshot.attribution.sources_up
    running: list[JobUsage] = []
    ended: list[JobUsage] = []
    for job in charged:
        holder = now.pop((job.scheduler, job.job_id), None)
        if holder is not None:
            running.append(dataclasses.replace(job, held_gpus=holder.gpus, labels=holder.labels or job.labels))
        elif sources_up.get(SOURCE_OF.get(job.scheduler, job.scheduler)):
            ended.append(dataclasses.replace(job, ended_at=taken_at, held_gpus=()))
        else:  # its source cannot say now (down, or not read yet after a restart): still running
            running.append(job)
    for holder in now.values():
        running.append(
            JobUsage(holder.job_id, holder.scheduler, holder.labels, taken_at, None, taken_at, (), holder.gpus)
        )
    kept = _bounded((*ledger.ended, *ended), taken_at, limits)
    return Ledger(tuple(running), kept, frozen_map(readings), taken_at), tuple(ended)


def _bounded(ended: Iterable[JobUsage], now: float, limits: Limits) -> tuple[JobUsage, ...]:
    """The ended jobs kept: at most max_ended, none older than keep_seconds, plots only on the newest."""
    kept = [job for job in ended if job.ended_at is not None and now - job.ended_at <= limits.keep_seconds]
    kept = kept[-limits.max_ended :] if limits.max_ended else []
    cut = len(kept) - limits.max_histories
    return tuple(
        dataclasses.replace(job, devices=tuple(dataclasses.replace(d, history=()) for d in job.devices))
        if index < cut and any(d.history for d in job.devices)
        else job
        for index, job in enumerate(kept)
    )
