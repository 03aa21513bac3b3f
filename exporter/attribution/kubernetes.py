"""Which pod holds each GPU: the kubelet's pod-resources v1 API over its unix socket.

The stubs come from podresources_v1.proto at import (grpc.protos_and_services compiles it in
memory with grpcio-tools; nothing generated is checked in or written to disk, so a read-only
container filesystem and a plain wheel both work). The client asks for raw bytes; decoding them and
turning pods into claims are pure functions over those bytes, fuzzed like every other parser.

Device IDs, as the allocators name them:
- ROCm/k8s-device-plugin: a whole GPU and partition 0 by PCI BDF ("0000:19:00.0", any case);
  partitions 1..N-1 by platform device ("amdgpu_xcp_3"; "amdgpu_xcp.3" on some kernels).
- AMD's DRA driver (driver name "gpu.amd.com"): a whole GPU or a partition as "gpu-<card>-<renderD>"
  (DRM card index and render minor, e.g. "gpu-0-128"); in its auto-partition mode a virtual device
  "gpu-<index>-<compute>-<memory>" ("gpu-1-cpx-nps4") on the index-th GPU in PCI order (which of
  its partitions the claim got is not reported: it is attributed to the GPU's partition 0);
  VFIO passthrough devices ("gpu-vfio-<n>") are not amdgpu devices and are skipped.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from exporter.attribution.matching import normalize_bdf, xcp_index
from exporter.attribution.schedule import AttributionReadError, ScheduledAttribution
from exporter.grpcproto import compile_proto
from exporter.model import ByBdf, ByDrm, ByPhysicalIndex, ByXcp, Claim, DeviceName

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCE_PREFIXES = ("amd.com/",)
DRA_DRIVER_PREFIXES = ("gpu.amd.com",)
LABELS = ("pod", "namespace", "container")
SOURCE = "kubernetes"

_PROTO = "exporter/attribution/podresources_v1.proto"
_DRA_DRM = re.compile(r"^gpu-(\d+)-(\d+)$")
_DRA_AUTO_PARTITION = re.compile(r"^gpu-(\d+)-(spx|dpx|tpx|qpx|cpx)-(nps\d)$", re.IGNORECASE)


class PodResourcesError(AttributionReadError):
    """The kubelet could not be asked or its answer not read; the message is one line."""


def protos() -> Any:
    """The message classes, compiled from the .proto on first use (needs grpcio-tools)."""
    return _compile()[0]


def services() -> Any:
    """The service stubs and servicer base (the fake kubelet in the tests implements it)."""
    return _compile()[1]


def _compile() -> tuple[Any, Any]:
    return compile_proto(_PROTO)


def device_plugin_device(device_id: str) -> DeviceName | None:
    """A device plugin's device ID -> the device it names; None for IDs that are not ours."""
    if (bdf := normalize_bdf(device_id)) is not None:
        return ByBdf(bdf)
    if (xcp := xcp_index(device_id)) is not None:
        return ByXcp(xcp)
    return None


def dra_device(device_name: str) -> DeviceName | None:
    """An AMD DRA driver device name -> the device it names; None for VFIO and unknown names."""
    if match := _DRA_DRM.match(device_name):
        return ByDrm(int(match.group(1)), int(match.group(2)))
    if match := _DRA_AUTO_PARTITION.match(device_name):
        return ByPhysicalIndex(int(match.group(1)))
    # A driver that names devices like the device plugin does.
    return device_plugin_device(device_name)


def claims_from_list_response(
    data: bytes, resource_prefixes: Sequence[str] = DEFAULT_RESOURCE_PREFIXES
) -> tuple[Claim, ...]:
    """Pure: a serialized ListPodResourcesResponse -> one claim per (container, AMD device)."""
    from google.protobuf.message import DecodeError

    try:
        response = protos().ListPodResourcesResponse.FromString(data)
    except (DecodeError, ValueError, RecursionError) as error:
        raise PodResourcesError(f"kubelet sent an undecodable ListPodResourcesResponse: {error}") from None
    claims: list[Claim] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            labels = (("pod", pod.name), ("namespace", pod.namespace), ("container", container.name))
            for devices in container.devices:
                if not devices.resource_name.startswith(tuple(resource_prefixes)):
                    continue
                for device_id in devices.device_ids:
                    name = device_plugin_device(device_id)
                    if name is not None:
                        claims.append(Claim(name, device_id, labels, devices.resource_name))
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    if not resource.driver_name.startswith(DRA_DRIVER_PREFIXES):
                        continue
                    name = dra_device(resource.device_name)
                    if name is not None:
                        claims.append(Claim(name, resource.device_name, labels, resource.driver_name))
    return tuple(claims)


class PodResourcesClient:
    """A gRPC channel to the kubelet's unix socket. Blocking; one call at a time."""

    def __init__(self, socket_path: str) -> None:
        import grpc

        self.socket_path = socket_path
        self._grpc = grpc
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        # Raw bytes out: the response is decoded by the pure claims_from_list_response.
        self._list = self._channel.unary_unary(
            "/v1.PodResourcesLister/List",
            request_serializer=lambda request: protos().ListPodResourcesRequest().SerializeToString(),
            response_deserializer=None,
        )

    def list_raw(self, timeout: float) -> bytes:
        """One List call with a deadline. Raises PodResourcesError with a one-line reason."""
        try:
            return bytes(self._list(None, timeout=timeout))
        except self._grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                raise PodResourcesError(f"kubelet did not answer within {timeout:g} s") from None
            details = error.details() if hasattr(error, "details") else str(error)
            name = code.name.lower() if code is not None else "error"
            raise PodResourcesError(f"kubelet pod-resources at {self.socket_path}: {name}: {details}") from None

    def close(self) -> None:
        self._channel.close()


class KubernetesAttribution(ScheduledAttribution):
    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        interval: float = 10.0,
        timeout: float = 2.0,
        keep_for: float = 60.0,
        resource_prefixes: Sequence[str] = DEFAULT_RESOURCE_PREFIXES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_prefixes = tuple(resource_prefixes)
        self._client = PodResourcesClient(socket_path)
        # The call has its own deadline; the read's is a backstop a little behind it.
        super().__init__(
            SOURCE, self._read_claims, interval, keep_for, clock, describe=socket_path, deadline=timeout + 1.0
        )

    def _read_claims(self) -> tuple[Claim, ...]:
        data = self._client.list_raw(self.timeout)
        return claims_from_list_response(data, self.resource_prefixes)

    def close(self) -> None:
        super().close()
        self._client.close()
