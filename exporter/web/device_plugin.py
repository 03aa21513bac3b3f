"""The health verdict per GPU for ROCm's Kubernetes device plugin (--device-plugin.socket).

ROCm/k8s-device-plugin, run with a heartbeat (-pulse N), asks AMD device-metrics-exporter's gRPC
MetricsService on a unix socket (internal/pkg/exporter/health.go: List with a 5 s deadline, each
pulse) and sets each of its devices' health from the answer: "unhealthy" takes the device out of
the node's allocatable GPUs; a device missing from the answer, or no socket at all, gets the
plugin's own check (a GPU node exists in KFD's topology: healthy). This module serves that same
service (metricssvc.proto, the same wire names) from the verdict the daemon computes every cycle:

- a GPU the verdict finds unfit (any failing check, device_down included) is "unhealthy";
- a fit GPU is "healthy";
- a GPU not judged yet (not read since the exporter started), and every GPU while the verdict is
  stale (no cycle within /readyz's freshness limit, or the health stage failing), is left out of the
  answer, so the plugin falls back to its own check: the exporter never holds a GPU out of
  scheduling on a verdict it has not made, and never calls healthy what it has not read. Leaving
  out is also the only answer that means "no opinion" to every plugin release: before ROCm's fix
  cb9116fc (June 2026, in no tag yet) the plugin took any Health other than "healthy" for
  unhealthy.

Device is the plugin's device ID: the PCI address as the kernel names the function ("0000:c1:00.0",
lower case, domain included) for a whole GPU and for partition 0, the platform device
("amdgpu_xcp_3") for a compute partition > 0; a partition without one is left out.

gRPC runs on its own threads (grpc.server and a two-thread pool); an answer is built from the last
published cycle, a reference read without a lock, so no call waits on the poll loop and the poll
loop never waits on a call; a client that connects and never reads costs a connection in gRPC's
core, never a thread of ours or a scrape.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from exporter.attribution.matching import xcp_index
from exporter.config import ConfigError
from exporter.grpcproto import compile_proto
from exporter.log import get_logger
from exporter.model import DEVICE_PLUGIN_METHODS, DevicePluginStats, DeviceState, Published, frozen_map

log = get_logger("exporter.web.device_plugin")

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
SERVICE = "metricssvc.MetricsService"
_PROTO = "exporter/web/metricssvc.proto"
_WORKERS = 2
_MAX_CONCURRENT_CALLS = 16  # more at once are refused (RESOURCE_EXHAUSTED) by gRPC, not queued


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as the service answers it (metricssvc.GPUState)."""

    id: str
    uuid: str
    health: str
    workloads: tuple[str, ...]
    device: str


def plugin_device_id(state: DeviceState) -> str | None:
    """The device plugin's ID of a device: its PCI address (partition 0 or a whole GPU) or its platform
    device amdgpu_xcp_N (a partition > 0); None when it has none the plugin would use."""
    identity = state.identity
    if identity.partition == 0:
        return identity.pci_bus_id.lower()
    name = identity.device_dir.rstrip("/").rsplit("/", 1)[-1]
    return name if xcp_index(name) is not None and name.startswith("amdgpu_xcp_") else None


def _workloads(published: Published, gpu: int) -> tuple[str, ...]:
    names = []
    for allocation in published.snapshot.attribution.allocations:
        if allocation.gpu != gpu:
            continue
        labels = dict(allocation.labels)
        if labels.get("pod"):
            names.append(f"{labels.get('namespace', '')}/{labels['pod']}")
        elif labels.get("job_id"):
            names.append(labels["job_id"])
    return tuple(dict.fromkeys(names))


def gpu_states(published: Published | None, now_monotonic: float, max_age: float) -> tuple[GpuState, ...]:
    """Pure: the GPUs the service answers for, from one published cycle (module docstring: who is left out)."""
    if published is None or "health" in published.stats.failing_stages:
        return ()
    if now_monotonic - published.snapshot.monotonic_at > max_age:
        return ()
    states = {state.identity.key: state for state in published.snapshot.devices}
    out = []
    for verdict in published.health.gpus:
        state = states.get(verdict.device_key)
        if state is None or state.down_reason == "not_read_yet":
            continue
        device = plugin_device_id(state)
        if device is None:
            continue
        out.append(
            GpuState(
                id=str(verdict.gpu),
                uuid=state.identity.unique_id,
                health=HEALTHY if verdict.fit else UNHEALTHY,
                workloads=_workloads(published, verdict.gpu),
                device=device,
            )
        )
    return tuple(out)


def _compile() -> tuple[Any, Any]:
    return compile_proto(_PROTO)


def _response(states: Iterable[GpuState]) -> Any:
    protos = _compile()[0]
    return protos.GPUStateResponse(
        GPUState=[
            protos.GPUState(
                ID=s.id, UUID=s.uuid, Health=s.health, AssociatedWorkload=list(s.workloads), Device=s.device
            )
            for s in states
        ]
    )


def _claim_socket_path(path: str) -> None:
    """Make the socket's folder if missing (0755, as DME and the plugin's DirectoryOrCreate do) and remove a
    stale socket; ConfigError when something else is there or a live server answers on it (DME)."""
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o755, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"--device-plugin.socket: cannot create {folder}: {error.strerror}") from None
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise ConfigError(f"--device-plugin.socket: {path}: {error.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"--device-plugin.socket: {path} exists and is not a socket (left alone)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as error:
        if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError(f"--device-plugin.socket: {path}: {error.strerror or error}") from None
    else:
        raise ConfigError(
            f"--device-plugin.socket: a server already answers on {path} (AMD's device-metrics-exporter?): "
            "only one process can serve the device plugin"
        )
    finally:
        probe.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("device_plugin_stale_socket_removed", path=path)


def _check_bind(path: str) -> None:
    """Bind a socket at the path once and remove it: a folder the exporter may not write in is a clear
    one-line error here, not gRPC's (which says only that it could not bind)."""
    trial = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        trial.bind(path)
    except OSError as error:
        raise ConfigError(f"--device-plugin.socket: cannot create a socket at {path}: {error.strerror}") from None
    finally:
        trial.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class DevicePluginService:
    """The gRPC server on the unix socket: start() first thing at start-up, follow() once the pipeline
    exists, stop() at exit. The call counter is read by the pipeline each cycle (stats())."""

    def __init__(
        self,
        path: str,
        max_age: float,
        published: Callable[[], Published | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        # What the answers are made of: nothing (every GPU left out) until follow() gives the pipeline's.
        self._published = published
        self._max_age = max_age
        self._clock = clock
        self._calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server: Any = None
        self._inode: int | None = None

    def follow(self, published: Callable[[], Published | None]) -> None:
        """Answer from this from now on: the latest published cycle (the pipeline exists after the socket,
        which is claimed first so that a socket another server owns stops the start before anything runs)."""
        self._published = published

    def stats(self) -> DevicePluginStats:
        with self._lock:
            return DevicePluginStats(calls=frozen_map({m: self._calls.get(m, 0) for m in DEVICE_PLUGIN_METHODS}))

    def _answered(self, method: str) -> None:
        with self._lock:
            self._calls[method] += 1

    def _states(self) -> tuple[GpuState, ...]:
        return gpu_states(self._published(), self._clock(), self._max_age)

    def list_states(self, request: Any, context: Any) -> Any:
        response = _response(self._states())
        self._answered("List")
        return response

    def get_states(self, request: Any, context: Any) -> Any:
        wanted = set(request.ID)
        response = _response(s for s in self._states() if s.id in wanted)
        self._answered("GetGPUState")
        return response

    def start(self) -> None:
        """Listen on the socket (mode 0600: the plugin runs as root). ConfigError when it cannot."""
        import grpc

        _, services = _compile()
        _claim_socket_path(self.path)
        _check_bind(self.path)
        service = self

        class Servicer(services.MetricsServiceServicer):  # type: ignore[name-defined]
            def List(self, request: Any, context: Any) -> Any:  # the gRPC method names are upstream's
                return service.list_states(request, context)

            def GetGPUState(self, request: Any, context: Any) -> Any:
                return service.get_states(request, context)

            def SetError(self, request: Any, context: Any) -> Any:
                # DME's error-injection debug API (off in DME unless its config enables it): not ours.
                context.set_code(grpc.StatusCode.UNIMPLEMENTED)
                context.set_details("SetError is not served: amdgpu-exporter judges only what it reads")
                return _compile()[0].GPUErrorResponse()

        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="device-plugin"),
            maximum_concurrent_rpcs=_MAX_CONCURRENT_CALLS,
        )
        services.add_MetricsServiceServicer_to_server(Servicer(), server)
        try:
            server.add_insecure_port(f"unix:{self.path}")
        except RuntimeError as error:
            raise ConfigError(f"--device-plugin.socket: cannot listen on {self.path}: {error}") from None
        server.start()
        try:
            os.chmod(self.path, 0o600)
            self._inode = os.lstat(self.path).st_ino
        except OSError as error:
            server.stop(None)
            raise ConfigError(f"--device-plugin.socket: {self.path}: {error.strerror}") from None
        self._server = server
        log.info("device_plugin_listening", socket=self.path, service=SERVICE)

    def stop(self, grace: float = 1.0) -> None:
        """Stop answering and remove the socket, unless another process has put its own there since."""
        if self._server is None:
            return
        self._server.stop(grace).wait(grace + 1.0)
        self._server = None
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)
