"""The view model the status page, /api/v1/devices and `snapshot` share: pure functions of one cycle.

The JSON documents of docs/api.md, and the devices grouped by physical part: the dies of one package
(the two GCDs of an MI250X) and the partitions of one socket (an MI300X in CPX mode) go under one
heading, because an operator reasons about the physical part: its power cap, its cooling, its serial.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from exporter.model import AlertState, Attribution, DeviceState, GpuHealth, HealthVerdict, Published, Sample, Snapshot

GIB = 1024**3


def holders_json(attribution: Attribution, gpu: int) -> list[dict[str, Any]]:
    """Who holds device `gpu`: its pods and Slurm jobs (in the enrich stage's order), then its processes."""
    holders: list[dict[str, Any]] = []
    for allocation in attribution.allocations:
        if allocation.gpu != gpu:
            continue
        holder: dict[str, Any] = {"source": allocation.source, **dict(allocation.labels)}
        if allocation.source != "slurm":  # a Slurm claim's resource is always "slurm": nothing to say
            holder["resource"] = allocation.resource
        holder["device_id"] = allocation.device_id
        holders.append(holder)
    processes = [usage for usage in attribution.processes if usage.gpu == gpu]
    holders += [{"source": "processes", "pid": u.pid, "comm": u.comm, "vram_bytes": u.vram_bytes} for u in processes]
    return holders


def unreported(state: DeviceState) -> dict[str, str]:
    """Why a read device shows no power or gfx busy of its own ("power" / "busy" -> reason): the
    package's power is measured on an MI250X's die 0 and a socket's on its partition 0; a partition
    has a busy of its own only from tables with per-partition figures (v1_6 on)."""
    sample, ident = state.sample, state.identity
    if sample is None:
        return {}
    reasons = {}
    if sample.power_watts is None and sample.power_cap_watts is None and (ident.partition or ident.die):
        reasons["power"] = "on partition 0" if ident.partition else "on die 0"
    if "gfx" not in sample.busy and ident.partition:
        reasons["busy"] = f"not in gpu_metrics {ident.gpu_metrics_version or '?'}"
    return reasons


def device_json(state: DeviceState, now: float, attribution: Attribution | None = None) -> dict[str, Any]:
    """One device entry; with attribution on (any source configured) it carries `holders`, maybe []."""
    ident = state.identity
    sample = state.sample
    data: dict[str, Any] = {
        "gpu": state.gpu,
        "up": state.up,
        "down_reason": state.down_reason or None,
        "identity": {
            "pci_bus_id": ident.pci_bus_id,
            "card": ident.card,
            "unique_id": ident.unique_id,
            "product": ident.product,
            "asic": ident.asic,
            "device_id": ident.device_id,
            "serial": ident.serial,
            "vbios": ident.vbios,
            "driver_version": ident.driver_version,
            "package": ident.package,
            "die": ident.die,
            "partition": ident.partition,
            "compute_partition": ident.compute_partition,
            "memory_partition": ident.memory_partition,
            "gpu_metrics_version": ident.gpu_metrics_version,
            "firmware": dict(ident.firmware),
            "topology": [dataclasses.asdict(link) for link in ident.topology],
        },
        "sample": None,
        "unreported": unreported(state),
        "read_errors": dict(state.read_errors),
        "read_timeouts": state.read_timeouts,
    }
    if sample is not None:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(sample):
            value = getattr(sample, f.name)
            if f.name == "cper_records":  # a ring can hold thousands: paged at /api/v1/devices/{gpu}/cper
                out["cper_record_count"] = len(value)
                continue
            if hasattr(value, "items"):
                value = {"/".join(map(str, k)) if isinstance(k, tuple) else str(k): v for k, v in value.items()}
            elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
                value = [dataclasses.asdict(item) for item in value]
            out[f.name] = value
        out["age_seconds"] = round(now - sample.timestamp, 3)
        data["sample"] = out
    if attribution is not None and attribution.sources_up:
        data["holders"] = holders_json(attribution, state.gpu)
    return data


def devices_document(snapshot: Snapshot, now: float, node: str) -> dict[str, Any]:
    """The /api/v1/devices document (docs/api.md); `snapshot --json` prints the same. node: the
    name alerts carry (--node-name, else the host name)."""
    return {
        "node": node,
        "taken_at": snapshot.taken_at,
        "source": snapshot.source,
        "cycle": snapshot.cycle,
        "poll_duration_seconds": snapshot.poll_duration_seconds,
        "devices": [device_json(d, now, snapshot.attribution) for d in snapshot.devices],
    }


CPER_PAGE_DEFAULT = 100
CPER_PAGE_MAX = 1000


def cper_document(snapshot: Snapshot, gpu: int, offset: int, limit: int) -> dict[str, Any] | None:
    """The /api/v1/devices/{gpu}/cper document (docs/api.md): one page of the device's CPER records,
    oldest first, from position `offset` of the ring as read at `taken_at`; None for an unknown gpu."""
    state = next((d for d in snapshot.devices if d.gpu == gpu), None)
    if state is None:
        return None
    records = state.sample.cper_records if state.sample is not None else ()
    page = records[offset : offset + limit]
    after = offset + len(page)
    return {
        "gpu": gpu,
        "taken_at": snapshot.taken_at,
        "total": len(records),
        "offset": offset,
        "records": [dataclasses.asdict(record) for record in page],
        "next_offset": after if after < len(records) else None,
    }


def health_text(gpu: GpuHealth | None) -> str:
    """'fit', or the failing checks: 'UNFIT ecc_uncorrectable,device_down' (the table and the page)."""
    if gpu is None:
        return "-"
    return "fit" if gpu.fit else "UNFIT " + ",".join(c.check for c in gpu.checks)


def health_of(verdict: HealthVerdict, gpu: int) -> GpuHealth | None:
    return next((g for g in verdict.gpus if g.gpu == gpu), None)


def health_document(published: Published, node: str) -> dict[str, Any]:
    """The /api/v1/health document (docs/api.md): one per node, every GPU's verdict and its evidence,
    and what to run about it (the daemon never does)."""
    verdict = published.health
    states = {d.gpu: d for d in published.snapshot.devices}
    gpus = []
    for gpu in verdict.gpus:
        state = states.get(gpu.gpu)
        identity = state.identity if state is not None else None
        gpus.append(
            {
                "gpu": gpu.gpu,
                "pci_bus_id": identity.pci_bus_id if identity is not None else "",
                "unique_id": identity.unique_id if identity is not None else "",
                "serial": identity.serial if identity is not None else "",
                "partition": identity.partition if identity is not None else 0,
                "fit": gpu.fit,
                "checks": [
                    {
                        "check": c.check,
                        "severity": c.severity,
                        "reason": c.reason,
                        "since": c.since,
                        "age_seconds": max(0.0, verdict.taken_at - c.since),
                    }
                    for c in gpu.checks
                ],
            }
        )
    commands = {}
    if verdict.resume_command:
        commands["slurm"] = {"suggested_command": verdict.drain_command or None, "undo_command": verdict.resume_command}
        commands["kubernetes"] = {
            "suggested_command": verdict.taint_command or None,
            "undo_command": verdict.untaint_command,
        }
    return {
        "node": node,
        "taken_at": verdict.taken_at,
        "fit": verdict.fit,
        "unfit_gpus": [gpu.gpu for gpu in verdict.gpus if not gpu.fit],
        "gpus": gpus,
        "suggestion": verdict.suggestion or None,
        "commands": commands,
        "note": _actions_note(published) + _device_plugin_note(published),
    }


def _device_plugin_note(published: Published) -> str:
    if published.stats.device_plugin is None:
        return ""
    return (
        " The verdict per GPU is served to ROCm's device plugin (--device-plugin.socket), which allocates no "
        "unfit GPU to a new pod."
    )


def _actions_note(published: Published) -> str:
    actions = published.stats.actions
    if actions is None or actions.mode == "off":
        return "A suggestion only: the exporter never drains, taints or changes anything."
    if actions.mode == "dry-run":
        return "Slurm action mode dry-run (--action.slurm): the drain and resume are logged and counted, never run."
    return (
        "Slurm action mode on (--action.slurm): the exporter runs the drain and resume above itself, within its "
        "bounds (amdgpu_exporter_actions_total counts each action by outcome); it never taints a Kubernetes node."
    )


def alert_state(alert: AlertState) -> str:
    return "firing" if alert.firing else ("pending" if alert.pending_since is not None else "inactive")


def alert_json(alert: AlertState) -> dict[str, Any]:
    data = dataclasses.asdict(alert)
    data["state"] = alert_state(alert)
    data["suggested_command"] = alert.suggested_command or None
    data["note"] = "A suggestion only: the exporter never changes GPU settings."
    return data


def active_alerts(alerts: Iterable[AlertState], gpu: int) -> list[AlertState]:
    """The firing and pending alerts of device `gpu`."""
    return [a for a in alerts if a.gpu == gpu and (a.firing or a.pending_since is not None)]


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """The devices of one physical package or socket, in gpu order."""

    package: str
    devices: tuple[DeviceState, ...]

    @property
    def partitioned(self) -> bool:
        """True for a socket split into partitions (MI300X DPX/QPX/CPX), False for dies or one device."""
        return any(d.identity.compute_partition not in ("", "SPX") for d in self.devices)

    def unit_label(self, device: DeviceState) -> str:
        if len(self.devices) == 1 and not self.partitioned:
            return ""
        return f"p{device.identity.partition}" if self.partitioned else f"d{device.identity.die}"

    @property
    def title(self) -> str:
        """'AMD Instinct MI300X · socket S0 · CPX/NPS4 · 8 partitions', '… · package P1 · 2 dies', '… · <BDF>'."""
        first = self.devices[0].identity
        product = first.product or first.device_id or "unknown device"
        count = len(self.devices)
        if self.partitioned:
            modes = "/".join(p for p in (first.compute_partition, first.memory_partition) if p)
            where = f"socket {first.serial or self.package} · {modes} · {count} partition{'s' * (count != 1)}"
        elif count > 1:
            where = f"package {first.serial or self.package} · {count} dies"
        else:
            where = first.pci_bus_id
        return f"{product} · {where}"


def group_devices(devices: Iterable[DeviceState]) -> tuple[DeviceGroup, ...]:
    """Groups by package id, in the order of each package's first gpu index."""
    groups: dict[str, list[DeviceState]] = {}
    for device in sorted(devices, key=lambda d: d.gpu):
        groups.setdefault(device.identity.package or device.identity.pci_bus_id, []).append(device)
    return tuple(DeviceGroup(package, tuple(members)) for package, members in groups.items())


def vram_used_total(sample: Sample) -> tuple[float | None, float | None]:
    """VRAM used and total, bytes; a partition that reports no use of its own shows its share."""
    used = sample.memory_used_bytes.get("vram")
    totals = sample.memory_total_bytes
    total = totals.get("vram") if used is not None else totals.get("partition_vram", totals.get("vram"))
    return used, total
