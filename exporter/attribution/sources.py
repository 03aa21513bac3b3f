"""The attribution sources the settings ask for, each on its own thread, and their reports per cycle."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.attribution import kubernetes, processes, slurm
from exporter.attribution.processes import DEFAULT_TOP, ProcessReport
from exporter.attribution.schedule import ScheduledAttribution
from exporter.config import Settings
from exporter.model import AttributionReport


@dataclass(frozen=True, slots=True)
class AttributionInputs:
    """What the attribution sources hold at one cycle (immutable reports, read without I/O)."""

    label_names: tuple[str, ...] = ()
    reports: tuple[AttributionReport, ...] = ()
    processes: ProcessReport | None = None
    process_top: int = DEFAULT_TOP


class AttributionSources:
    """Starts the sources for `settings` (none when all are off); inputs() never blocks."""

    def __init__(self, settings: Settings, sysfs_root: str) -> None:
        self._scheduled: list[ScheduledAttribution] = []
        label_names: list[str] = []
        if settings.kubernetes:
            self._scheduled.append(
                kubernetes.KubernetesAttribution(
                    settings.kubernetes_pod_resources_socket,
                    interval=settings.kubernetes_interval,
                    timeout=settings.kubernetes_timeout,
                    keep_for=max(60.0, 3 * settings.kubernetes_interval),
                    resource_prefixes=settings.kubernetes_resource_prefix,
                )
            )
            label_names += kubernetes.LABELS
        if settings.slurm_state_dir:
            self._scheduled.append(slurm.SlurmAttribution(settings.slurm_state_dir, interval=settings.interval))
            label_names += slurm.LABELS
        self._processes = (
            processes.ProcessCollector(sysfs_root, interval=settings.slow_interval)
            if settings.collector_processes
            else None
        )
        self._label_names = tuple(label_names)
        self._top = settings.collector_processes_top

    @property
    def enabled(self) -> bool:
        return bool(self._scheduled) or self._processes is not None

    def start(self) -> None:
        # The first read of each source happens on its thread: a missing kubelet never delays start-up.
        for source in self._scheduled:
            source.start()
        if self._processes is not None:
            self._processes.start()

    def inputs(self) -> AttributionInputs:
        return AttributionInputs(
            label_names=self._label_names,
            reports=tuple(source.current() for source in self._scheduled),
            processes=self._processes.current() if self._processes is not None else None,
            process_top=self._top,
        )

    def close(self) -> None:
        for source in self._scheduled:
            source.close()
        if self._processes is not None:
            self._processes.close()
