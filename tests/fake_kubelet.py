"""A fake kubelet: a real gRPC server on a unix socket implementing pod-resources v1 from our .proto.

Pods are set by the test (`set_pods`) and can come and go between calls; `delay` makes every answer
late, to hold the client to its deadline, and `answering` cleared holds every answer until it is set
again (a kubelet that does not answer at all: whoever waited for it would wait for ever). Run
in-process (`FakeKubelet`) or as its own process (`python -m tests.fake_kubelet SOCKET STATE_JSON`,
re-reading STATE_JSON on every call) for tests that start the daemon.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from exporter.attribution import kubernetes


@dataclass
class FakeContainer:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids
    dra: list[tuple[str, str, str]] = field(default_factory=list)  # (claim name, driver name, device name)


@dataclass
class FakePod:
    name: str
    namespace: str
    containers: list[FakeContainer]


def pods_from_json(data: Any) -> list[FakePod]:
    return [
        FakePod(
            pod["name"],
            pod["namespace"],
            [
                FakeContainer(c["name"], dict(c.get("devices", {})), [tuple(d) for d in c.get("dra", [])])
                for c in pod["containers"]
            ],
        )
        for pod in data
    ]


def list_response(pods: list[FakePod]) -> Any:
    pb = kubernetes.protos()
    response = pb.ListPodResourcesResponse()
    for pod in pods:
        message = response.pod_resources.add(name=pod.name, namespace=pod.namespace)
        for container in pod.containers:
            c = message.containers.add(name=container.name)
            for resource, ids in container.devices.items():
                c.devices.add(resource_name=resource, device_ids=ids)
            c.cpu_ids.extend([2, 3])
            for claim, driver, device in container.dra:
                dynamic = c.dynamic_resources.add(claim_name=claim, claim_namespace=pod.namespace)
                dynamic.claim_resources.add(driver_name=driver, pool_name="node-1", device_name=device)
    return response


class FakeKubelet:
    def __init__(self, socket_path: str, state_file: str | None = None) -> None:
        self.socket_path = socket_path
        self.state_file = state_file
        self.delay = 0.0
        self.answering = threading.Event()
        self.answering.set()
        self.calls = 0
        self._pods: list[FakePod] = []
        self._lock = threading.Lock()
        services = kubernetes.services()
        fake = self

        class Servicer(services.PodResourcesListerServicer):  # type: ignore[name-defined,misc]
            def List(self, request: Any, context: Any) -> Any:
                return fake._answer(context)

            def Get(self, request: Any, context: Any) -> Any:
                pb = kubernetes.protos()
                for pod in fake._current():
                    if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                        return pb.GetPodResourcesResponse(pod_resources=list_response([pod]).pod_resources[0])
                context.abort(grpc.StatusCode.NOT_FOUND, "pod not found")

        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        services.add_PodResourcesListerServicer_to_server(Servicer(), self._server)
        self._server.add_insecure_port(f"unix://{socket_path}")

    def set_pods(self, pods: list[FakePod]) -> None:
        with self._lock:
            self._pods = list(pods)

    def _current(self) -> list[FakePod]:
        if self.state_file is not None:
            state = json.loads(Path(self.state_file).read_text())
            self.delay = float(state.get("delay", 0.0))
            return pods_from_json(state["pods"])
        with self._lock:
            return list(self._pods)

    def _answer(self, context: Any) -> Any:
        self.calls += 1
        pods = self._current()
        if self.delay:
            time.sleep(self.delay)
        # A held answer ends when its caller gives up, so held calls never take every server thread.
        while not self.answering.wait(0.05) and context.is_active():
            pass
        return list_response(pods)

    def start(self) -> FakeKubelet:
        self._server.start()
        return self

    def stop(self) -> None:
        self.answering.set()  # held answers end, or their threads would keep the test process alive
        self._server.stop(grace=None)


def main() -> None:
    kubelet = FakeKubelet(sys.argv[1], sys.argv[2]).start()
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        kubelet._server.wait_for_termination()


if __name__ == "__main__":
    main()
