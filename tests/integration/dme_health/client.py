"""A DME health-service client in a process of its own (its .proto shares full names with the
product's, which one process's descriptor pool cannot hold twice): calls one method on the unix
socket, as ROCm's device plugin does (a fresh channel, a 5 s deadline), and prints the answer as JSON.

    python client.py SOCKET List
    python client.py SOCKET GetGPUState ID [ID ...]
    python client.py SOCKET SetError
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc
from google.protobuf.empty_pb2 import Empty
from google.protobuf.json_format import MessageToDict

HERE = Path(__file__).resolve().parent


def main(socket_path: str, method: str, *ids: str) -> int:
    sys.path.insert(0, str(HERE))
    protos, services = grpc.protos_and_services("metricssvc.proto")
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        stub = services.MetricsServiceStub(channel)
        try:
            if method == "List":
                answer = stub.List(Empty(), timeout=5)
            elif method == "GetGPUState":
                answer = stub.GetGPUState(protos.GPUGetRequest(ID=list(ids)), timeout=5)
            else:
                answer = stub.SetError(protos.GPUErrorRequest(ID="0", Fields=["x"], Counts=[1]), timeout=5)
        except grpc.RpcError as error:
            print(json.dumps({"code": error.code().name, "details": error.details()}))
            return 0
    print(json.dumps({"code": "OK", "answer": MessageToDict(answer, preserving_proto_field_name=True)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
