"""The exporter's memory ceilings, read from the units the project ships.

The systemd unit (deploy/systemd/amdgpu-exporter.service) caps the service with MemoryMax=; the
Kubernetes DaemonSet (deploy/kubernetes/daemonset.yaml) gives the exporter container a memory
limit. The exporter cannot tell which of them it runs under, so the dashboards draw both against
its resident memory and count an exporter as near its limit against the smaller one. A file or
value that cannot be read stops the build with a one-line error naming the file, so a changed
limit changes the dashboards and a renamed one is noticed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD_UNIT = ROOT / "deploy" / "systemd" / "amdgpu-exporter.service"
DAEMONSET = ROOT / "deploy" / "kubernetes" / "daemonset.yaml"
CONTAINER = "amdgpu-exporter"

# Share of the limit from which an exporter's resident memory is worth a look (a leak, or a limit
# too tight for the node's GCD count): a dashboard level, no rule defines it.
MEMORY_WARNING_RATIO = 0.8

# systemd.resource-control(5): K, M, G, T are powers of 1024.
_SYSTEMD_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
# Kubernetes quantities: binary (Ki, Mi, ...) and decimal (k, M, ...) suffixes.
_KUBERNETES_SUFFIXES = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
}


class LimitsError(ValueError):
    """A shipped unit lacks the memory limit the dashboards draw."""


@dataclass(frozen=True)
class MemoryLimits:
    systemd_memory_max_bytes: float  # MemoryMax= of the systemd unit
    kubernetes_memory_limit_bytes: float  # resources.limits.memory of the DaemonSet's exporter container

    @property
    def tightest_bytes(self) -> float:
        return min(self.systemd_memory_max_bytes, self.kubernetes_memory_limit_bytes)


def load(systemd_unit: Path = SYSTEMD_UNIT, daemonset: Path = DAEMONSET) -> MemoryLimits:
    return MemoryLimits(
        systemd_memory_max_bytes=systemd_memory_max(_read(systemd_unit), systemd_unit),
        kubernetes_memory_limit_bytes=kubernetes_memory_limit(_read(daemonset), daemonset),
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as error:
        raise LimitsError(f"{path}: cannot read: {error.strerror or error}") from None


def systemd_memory_max(text: str, path: Path) -> float:
    """The last MemoryMax= of the [Service] section (a later assignment overrides an earlier one)."""
    section = ""
    values: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
        elif section == "[Service]" and stripped.startswith("MemoryMax="):
            values.append(stripped.removeprefix("MemoryMax=").strip())
    if not values:
        raise LimitsError(f"{path}: no MemoryMax= in [Service]")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)", values[-1])
    if not match:
        raise LimitsError(f"{path}: MemoryMax={values[-1]}: want bytes with an optional K, M, G or T suffix")
    return float(match.group(1)) * _SYSTEMD_SUFFIXES[match.group(2)]


def kubernetes_memory_limit(text: str, path: Path, container: str = CONTAINER) -> float:
    """resources.limits.memory of the named container of the DaemonSet."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if isinstance(d, Mapping)]
    except yaml.YAMLError as error:
        raise LimitsError(f"{path}: not YAML: {' '.join(str(error).split())}") from None
    daemonsets = [d for d in documents if d.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        raise LimitsError(f"{path}: want one DaemonSet, found {len(daemonsets)}")
    containers = _dig(daemonsets[0], "spec", "template", "spec", "containers")
    named = [c for c in containers or () if isinstance(c, Mapping) and c.get("name") == container]
    if len(named) != 1:
        raise LimitsError(f"{path}: want one container named {container}, found {len(named)}")
    quantity = _dig(named[0], "resources", "limits", "memory")
    if quantity is None:
        raise LimitsError(f"{path}: container {container} has no resources.limits.memory")
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(quantity).strip())
    if not match:
        raise LimitsError(f"{path}: container {container}: memory limit {quantity!r} is not a quantity like 256Mi")
    return float(match.group(1)) * _KUBERNETES_SUFFIXES[match.group(2) or ""]


def _dig(node: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def mebibytes(value: float) -> str:
    return f"{value / 1024**2:g} MiB"


def promql_number(value: float) -> str:
    """A byte count in full (`:g` would round 536870912 to 5.36871e+08)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
