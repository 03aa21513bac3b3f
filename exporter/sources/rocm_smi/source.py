"""The rocm_smi source: librocm_smi64 (through pyrsmi) in a supervised worker process.

The library can abort() the calling process and block forever on a hung file, so it never runs in
the daemon: worker.py owns it and supervisor.py restarts that process when it dies or
hangs. This module is the Source the poller sees:

- discover(): the worker's device list (the library enumerates once, in rsmi_init) joined by PCI
  BDF to the fallback's (the sysfs source), identity fields read through the library on top;
- read(device): one request to the worker with a deadline, converted to a Sample
  (convert.py), with the fallback's values for whatever the library cannot read: voltages
  and throttle bits it drops from gpu_metrics, MI300 tables (content >= 4 aborts 5.2.x, so the
  worker does not ask), calls that once crashed a worker (blamed from its breadcrumbs), and
  devices the library does not enumerate at all. Each such decision is logged once;
- a device whose request times out is "hung": it is not asked again until its stuck call
  returns or a worker restart (backing off 1 s, 2 s, ... `hang_backoff_max`) frees it; other
  devices keep being read, and their requests lost in a restart are retried on the new worker.

Files whose read clears or resets them (xgmi_error, pcie_bw) have one reader only: the fallback
when there is one (it reads them anyway), else the library.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter.log import get_logger
from exporter.model import DeviceIdentity, Sample, SourceStats
from exporter.sources import textfiles as tf
from exporter.sources.base import Source, SourceError
from exporter.sources.identity import KNOWN_DEVICES, VF_DEVICE_IDS, assign_packages
from exporter.sources.rocm_smi import convert
from exporter.sources.rocm_smi.library import find_library
from exporter.sources.rocm_smi.supervisor import (
    ROCM_SMI_WORKER,
    CrashReport,
    RequestFailed,
    Supervisor,
    Worker,
    WorkerGone,
    WorkerUnavailable,
)
from exporter.sources.rocm_smi.worker import device_folders_by_bdf
from exporter.sources.sysfs import SysfsSource

log = get_logger("exporter.sources.rocm_smi")

_ATTEMPTS = 3  # a read survives two worker deaths (another device's crash, a hang restart)
# Without a fallback, the library's background reader of pcie_bw (a 1 s kernel sleep per read)
# refreshes each device this often.
_PCIE_THROUGHPUT_PERIOD = 30.0


@dataclass(slots=True)
class _Hung:
    generation: int
    since: float
    call: str
    kills: int = 0


class RocmSmiSource(Source):
    name = "rocm-smi"

    def __init__(
        self,
        fallback: SysfsSource | None = None,
        *,
        call_timeout: float = 1.5,
        hang_backoff_initial: float = 1.0,
        hang_backoff_max: float = 10.0,
        restart_backoff_max: float = 60.0,
        worker_prefix: Sequence[str] = (),
        shm_dir: str = "/dev/shm",
        guard_gpu_metrics: bool = True,
        quiet: bool = False,
    ) -> None:
        """`worker_prefix` runs the worker under a wrapper (tests: a mount namespace over a tree);
        `guard_gpu_metrics=False` lets the library see MI300 tables (tests of the crash path);
        `quiet` logs a worker that cannot start at debug level (the auto probe expects that on a
        host without a usable library, and reports the reason itself)."""
        self.fallback = fallback
        self.call_timeout = call_timeout
        self.slow_interval = fallback.slow_interval if fallback is not None else 10.0
        self.hang_backoff_initial = hang_backoff_initial
        self.hang_backoff_max = hang_backoff_max
        self.guard_gpu_metrics = guard_gpu_metrics
        self.supervisor = Supervisor(
            worker_prefix=worker_prefix,
            shm_dir=shm_dir,
            backoff_max=restart_backoff_max,
            on_crash=self._on_crash,
            quiet=quiet,
            worker_module=self.worker_module,
        )
        self._lock = threading.Lock()
        self._unsafe: dict[str, dict[str, str]] = {}  # BDF -> library call -> why the fallback serves it
        self._hung: dict[str, _Hung] = {}
        self._slow: dict[str, tuple[float, Mapping[str, Any]]] = {}
        self._xgmi_errors: dict[str, int] = {}
        self._library_identity: dict[str, Mapping[str, Any]] = {}
        self._logged: set[tuple[str, str]] = set()

    # The worker's answers -> a Sample, the worker process and the library's name in messages: the
    # amd-smi source has its own.
    sample_from_readings = staticmethod(convert.sample_from_readings)
    library_name = "librocm_smi64"
    worker_module = ROCM_SMI_WORKER

    def stats(self) -> SourceStats:
        return SourceStats(worker_restarts=self.supervisor.restarts)

    def needs_rediscovery(self) -> bool:
        """The fallback's (sysfs) word on a partition mode change: the libraries enumerate only at init."""
        return self.fallback is not None and self.fallback.needs_rediscovery()

    # -- discovery -------------------------------------------------------------------------
    def discover(self) -> Sequence[DeviceIdentity]:
        fallback = list(self.fallback.discover()) if self.fallback is not None else []
        try:
            worker = self.supervisor.ensure_worker()
        except WorkerUnavailable as error:
            if not fallback:
                raise SourceError(error.reason, f"{self.library_name} unavailable: {error}") from error
            self._log_once("", "worker_unavailable", "rocm_smi_unavailable_at_discovery", error=str(error))
            return fallback
        peers = {int(d["index"]): str(d["pci_bus_id"]) for d in _sockets(worker)}
        answers = self._identify_all(worker)
        # Compute partitions 1..N-1 of an MI300-class socket: the library reads only their nearly
        # empty platform device (N/A for nearly everything), so the fallback lists and reads them.
        partitions = [identity for identity in fallback if identity.partition > 0]
        by_bdf = {identity.pci_bus_id: identity for identity in fallback if identity.partition == 0}
        merged: dict[str, DeviceIdentity] = {}
        for device in _sockets(worker):
            bdf = str(device["pci_bus_id"])
            # timed out or failed: what the library said before, else the fallback's view
            ident = answers.get(bdf) or self._library_identity.get(bdf)
            if ident is not None:
                self._library_identity[bdf] = ident
                self._note_unsafe_metrics(bdf, str(ident.get("gpu_metrics_unsafe", "")))
            library = convert.identity_from_library(
                ident or {},
                pci_bus_id=bdf,
                card=str(device.get("card", "")),
                device_dir=str(device.get("device_dir", "")),
                driver_version=worker.driver_version,
                peer_bus_ids=peers,
            )
            base = by_bdf.get(bdf)
            merged[bdf] = convert.merge_identity(base, library) if base is not None else _standalone(library)
        for bdf, identity in by_bdf.items():
            if bdf not in merged:
                self._log_once(bdf, "not_enumerated", "rocm_smi_device_not_enumerated", served_by="fallback")
                merged[bdf] = identity
        devices = sorted([*merged.values(), *partitions], key=lambda d: (d.pci_bus_id, d.partition))
        # One rule for which dies share a package: the sysfs source's (by serial, dual-die device ids).
        return devices if self.fallback is not None else assign_packages(devices)

    def _identify_all(self, worker: Worker) -> dict[str, Mapping[str, Any]]:
        """identify() on every device in parallel; those lost to a worker crash are asked again
        (skipping the call blamed for it) on the next worker."""
        answers: dict[str, Mapping[str, Any]] = {}
        deadline = time.monotonic() + max(self.call_timeout * 2, 3.0)
        for _attempt in range(_ATTEMPTS):
            futures = {}
            for device in _sockets(worker):
                bdf = str(device["pci_bus_id"])
                if bdf in answers or self._is_hung(bdf, worker):
                    continue
                request = {"op": "identify", "device": int(device["index"]), "skip": sorted(self._skipped_calls(bdf))}
                try:
                    futures[bdf] = self.supervisor.submit(worker, request)
                except WorkerGone:
                    break
            lost = False
            for bdf, future in futures.items():
                try:
                    answers[bdf] = future.result(timeout=max(deadline - time.monotonic(), 0.0))
                except concurrent.futures.TimeoutError:
                    self._mark_hung(bdf, worker, future)
                except WorkerGone:
                    lost = True
                except RequestFailed as error:
                    log.warning("rocm_smi_identify_failed", pci_bus_id=bdf, error=str(error))
            if not lost:
                break
            try:
                worker = self.supervisor.ensure_worker(deadline)
            except WorkerUnavailable:
                break
        return answers

    # -- reading ---------------------------------------------------------------------------
    def read(self, device: DeviceIdentity) -> Sample:
        bdf = device.pci_bus_id
        if device.partition > 0:
            if self.fallback is None:
                raise SourceError("not_found", f"{bdf} partition {device.partition}: not read through librocm_smi64")
            return self.fallback.read(device)
        deadline = time.monotonic() + self.call_timeout
        lost: list[WorkerGone] = []
        restarted = False
        while len(lost) < _ATTEMPTS:
            try:
                worker = self.supervisor.ensure_worker(deadline)
            except WorkerUnavailable as error:
                return self._without_library(device, error.reason, f"librocm_smi64 worker unavailable: {error}")
            index = _index_of(worker, bdf)
            if index is None:
                return self._without_library(device, "not_found", f"{bdf} is not enumerated by librocm_smi64")
            hung = self._hung.get(bdf)
            if hung is not None and self._is_hung(bdf, worker):
                # Its stuck call still holds a worker thread (and the card's mutex): only a new
                # worker frees it. Restart when the backoff allows, else report it down.
                if restarted or time.monotonic() < hung.since + self._hang_delay(hung.kills):
                    raise SourceError("hung", f"{bdf}: a librocm_smi64 call ({hung.call}) has not returned")
                hung.kills += 1
                restarted = True
                self.supervisor.restart(f"{bdf} stuck in {hung.call}")
                continue
            try:
                readings, slow = self._request(worker, bdf, index, deadline)
            except WorkerGone as error:  # crashed or restarted under us: try again on the next worker
                lost.append(error)
                continue
            self._recovered(bdf)
            self._note_unsafe_metrics(bdf, str(readings.get("gpu_metrics_unsafe", "")))
            return self._sample(device, readings, slow)
        message = f"{bdf}: librocm_smi64 worker ended during the read: {lost[-1]}"
        return self._without_library(device, lost[-1].reason, message)

    def _request(self, worker: Worker, bdf: str, index: int, deadline: float) -> tuple[Mapping[str, Any], bool]:
        """One read request; (readings, whether it included the slow fields). Raises WorkerGone."""
        slow = time.monotonic() >= self._slow.get(bdf, (0.0, {}))[0] + self.slow_interval
        future = self.supervisor.submit(
            worker,
            {
                "op": "read",
                "device": index,
                "skip": sorted(self._skipped_calls(bdf)),
                "slow": slow,
                "pcie_throughput_period": _PCIE_THROUGHPUT_PERIOD if self.fallback is None else 0,
                "guard_gpu_metrics": self.guard_gpu_metrics,
            },
        )
        try:
            return future.result(timeout=max(deadline - time.monotonic(), 0.01)), slow
        except concurrent.futures.TimeoutError:
            call = self._mark_hung(bdf, worker, future)
            raise SourceError(
                "timeout", f"{bdf}: librocm_smi64 did not answer in {self.call_timeout} s (in {call or '?'})"
            ) from None
        except RequestFailed as error:
            raise SourceError(error.reason, f"{bdf}: {error}") from error

    def _sample(self, device: DeviceIdentity, readings: Mapping[str, Any], slow_due: bool) -> Sample:
        """The library's sample, the fallback's values under it; slow fields cached per device."""
        bdf = device.pci_bus_id
        if slow_due:
            self._slow[bdf] = (time.monotonic(), readings)
        slow = self._slow.get(bdf, (0.0, {}))[1]
        if slow_due and readings.get("xgmi_error") is not None:
            # rsmi_dev_xgmi_error_status reports 0, 1 or 2 (= "multiple"): a lower bound per read.
            with self._lock:
                self._xgmi_errors[bdf] = self._xgmi_errors.get(bdf, 0) + int(readings["xgmi_error"])
        xgmi = self._xgmi_errors.get(bdf)
        library = convert.for_device(self.sample_from_readings(readings, slow, time.time()), device, xgmi)
        if self.fallback is None:
            return library
        try:
            fallback = self.fallback.read(device)
        except SourceError as error:
            self._log_once(bdf, f"fallback:{error.reason}", "rocm_smi_fallback_read_failed", error=str(error))
            return library
        return convert.overlay(fallback, library)

    def _without_library(self, device: DeviceIdentity, reason: str, message: str) -> Sample:
        """The library cannot serve this device now: the fallback reads all of it, else it is down.

        Never for a device whose library call hung: the fallback would block on the same file.
        """
        hung = self._hung.get(device.pci_bus_id)
        if hung is not None:
            raise SourceError("hung", f"{message}; and a librocm_smi64 call ({hung.call}) hung on it before")
        if self.fallback is None:
            raise SourceError(reason, message)
        self._log_once(
            device.pci_bus_id, f"without_library:{reason}", "rocm_smi_device_served_by_fallback", why=message
        )
        return self.fallback.read(device)

    # -- what the library is not asked ---------------------------------------------------------
    def _skipped_calls(self, bdf: str) -> set[str]:
        skipped = set(self._unsafe.get(bdf, {}))
        if self.fallback is not None:
            # Read-clears / read-resets files: the fallback reads them, so the library must not.
            skipped.add("xgmi_error")
        return skipped

    def _note_unsafe_metrics(self, bdf: str, reason: str) -> None:
        if reason and self.guard_gpu_metrics:
            self._mark_unsafe(bdf, ("gpu_metrics", "energy"), reason)

    def _mark_unsafe(self, bdf: str, calls: Iterable[str], reason: str) -> None:
        with self._lock:
            calls_for_device = self._unsafe.setdefault(bdf, {})
            new = [call for call in calls if call not in calls_for_device]
            for call in new:
                calls_for_device[call] = reason
        if new:
            log.warning(
                "rocm_smi_call_served_by_fallback",
                pci_bus_id=bdf,
                calls=new,
                reason=reason,
                fallback=self.fallback is not None,
            )

    def unsafe_calls(self, bdf: str) -> dict[str, str]:
        """Library calls this device's reads skip, and why (the fallback serves their fields)."""
        with self._lock:
            return dict(self._unsafe.get(bdf, {}))

    def _on_crash(self, report: CrashReport) -> None:
        """Runs on the supervisor's reader thread when a worker dies: blame the call(s) in flight."""
        bdfs = {int(d["index"]): str(d["pci_bus_id"]) for d in report.devices}
        for device, call in report.blamed:
            bdf = bdfs.get(device)
            if bdf is not None and call:
                self._mark_unsafe(bdf, (call,), f"librocm_smi64 {report.reason} in {call} (worker {report.pid})")

    # -- hung devices ----------------------------------------------------------------------------
    def _hang_delay(self, kills: int) -> float:
        return min(self.hang_backoff_initial * 2**kills, self.hang_backoff_max)

    def _is_hung(self, bdf: str, worker: Worker) -> bool:
        hung = self._hung.get(bdf)
        return hung is not None and hung.generation == worker.generation

    def _mark_hung(self, bdf: str, worker: Worker, future: concurrent.futures.Future[Any]) -> str:
        """Note the device hung in this worker; returns the library call it is stuck in ("" unknown)."""
        index = _index_of(worker, bdf)
        call = self.supervisor.in_flight(worker, index) if index is not None else ""
        with self._lock:
            previous = self._hung.get(bdf)
            kills = previous.kills if previous is not None else 0
            self._hung[bdf] = _Hung(worker.generation, time.monotonic(), call, kills)
        log.warning("rocm_smi_device_hung", pci_bus_id=bdf, call=call, worker=worker.pid)

        def late_answer(done: concurrent.futures.Future[Any]) -> None:
            # The stuck call returned after all: the device can be asked again in this worker.
            if not done.cancelled() and not isinstance(done.exception(), WorkerGone):
                with self._lock:
                    if self._is_hung(bdf, worker):
                        self._hung[bdf].generation = -1

        future.add_done_callback(late_answer)
        return call

    def _recovered(self, bdf: str) -> None:
        with self._lock:
            if self._hung.pop(bdf, None) is not None:
                log.info("rocm_smi_device_answering", pci_bus_id=bdf)

    # -- misc --------------------------------------------------------------------------------
    def _log_once(self, bdf: str, what: str, event: str, **fields: Any) -> None:
        key = (bdf, what)
        if key not in self._logged:
            self._logged.add(key)
            log.warning(event, pci_bus_id=bdf, **fields)

    def close(self) -> None:
        self.supervisor.close()
        if self.fallback is not None:
            self.fallback.close()


def _index_of(worker: Worker, bdf: str) -> int | None:
    return next((int(device["index"]) for device in _sockets(worker) if device["pci_bus_id"] == bdf), None)


def _sockets(worker: Worker) -> list[Mapping[str, Any]]:
    """The library's devices that are a PCI device (partition 0 of a partitioned socket included)."""
    return [d for d in worker.devices if not d.get("partition")]


def _standalone(identity: DeviceIdentity) -> DeviceIdentity:
    """Without a fallback: ASIC and default product name from the PCI device id, as sysfs does."""
    asic, product = KNOWN_DEVICES.get(identity.device_id, ("", ""))
    deployment = "guest" if identity.device_id in VF_DEVICE_IDS else "baremetal"
    return replace(identity, asic=asic, product=identity.product or product, deployment=deployment)


# -- auto selection ---------------------------------------------------------------------------
def probe_rocm_smi(sysfs_root: str, *, worker_prefix: Sequence[str] = (), timeout: float = 10.0) -> tuple[bool, str]:
    """Can the rocm_smi source serve this host? Runs the library in a throwaway worker (self_check)."""
    path = find_library()
    if path is None:
        return False, "librocm_smi64 not found ($ROCM_PATH/lib, /opt/rocm/lib, /usr/lib ...)"
    return self_check(RocmSmiSource, path, sysfs_root, worker_prefix, timeout)


def self_check(
    kind: type[RocmSmiSource], name: str, sysfs_root: str, worker_prefix: Sequence[str], timeout: float
) -> tuple[bool, str]:
    """Can a source of `kind` serve this host? `name` (the library) starts every reason.

    Self-check in a throwaway worker: the library starts and enumerates at least one GPU; every GPU
    it enumerates is an amdgpu card under `sysfs_root` with the same unique_id there; one full read
    of each succeeds (an abort on one call is handled as in service: blamed, skipped, counted in the
    reason). Returns (ok, reason) for the log and amdgpu_exporter_build_info.
    """
    if not worker_prefix and os.path.realpath(sysfs_root) != "/sys":
        return False, f"{kind.library_name} reads /sys only, and the sysfs root is {sysfs_root}"
    with contextlib.closing(kind(None, worker_prefix=worker_prefix, call_timeout=timeout, quiet=True)) as source:
        try:
            devices = source.discover()
        except SourceError as error:
            return False, f"{name}: {error}"
        if not devices:
            return False, f"{name}: the library found no GPU"
        problems = [problem for device in devices for problem in _check_device(source, device, sysfs_root)]
        if problems:
            return False, f"{name}: self-check failed: {problems[0]}"
        rerouted = sum(len(source.unsafe_calls(d.pci_bus_id)) for d in devices)
        note = f"; {rerouted} library calls left to sysfs" if rerouted else ""
        version = source.supervisor.library_version
        return True, f"{name} (version {version}): {len(devices)} GPUs, self-check passed{note}"


def _check_device(source: RocmSmiSource, device: DeviceIdentity, sysfs_root: str) -> list[str]:
    bdf = device.pci_bus_id
    card_dir = device_folders_by_bdf(sysfs_root).get(bdf, ("", ""))[1]
    if not card_dir:
        return [f"{bdf} has no amdgpu card under {sysfs_root}/class/drm"]
    try:
        source.read(device)
    except SourceError as error:
        return [f"{bdf}: {error}"]
    try:
        with open(os.path.join(card_dir, "unique_id")) as handle:
            expected = tf.parse_unique_id(handle.read())  # "" for no id (0), as the library's is then
    except (OSError, ValueError):
        return []  # no unique_id file: nothing to compare
    if device.unique_id != expected:
        return [f"{bdf}: unique_id {device.unique_id or '(none)'} from the library, {expected} in sysfs"]
    return []
