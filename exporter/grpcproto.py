"""A .proto of this package compiled in memory on first use (grpc.protos_and_services, from
grpcio-tools): nothing generated is checked in or written to disk, so a read-only install works."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any


@functools.cache
def compile_proto(relative_path: str) -> tuple[Any, Any]:
    """(messages, services) of the .proto at `relative_path` ("exporter/..."), compiled once.

    grpc finds the .proto (and names the generated modules) through sys.path. An editable install
    puts no sys.path entry above the package (a meta-path finder maps it), so the folder holding
    `exporter/` is put on sys.path for the compile; with a wheel install it is already there."""
    import grpc

    root = str(Path(__file__).resolve().parents[1])
    added = root not in sys.path
    if added:
        sys.path.append(root)
    try:
        return grpc.protos_and_services(relative_path)
    finally:
        if added:
            sys.path.remove(root)
