"""The device-plugin health option on Kubernetes: the Helm value devicePluginHealth renders what the
kustomize component device-plugin-health patches in (alone and beside pod-attribution, which sets
the same uid), with a real helm and kubectl; the rendered DaemonSet passes the 1.30 and 1.37
schemas; and the flag it passes is one the daemon accepts, naming the socket ROCm's plugin asks."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import DME_HEALTH_SOCKET
from tests.integration.test_helm_chart import (
    CRD_KINDS,
    KUBERNETES_VERSIONS,
    NAMESPACE,
    _validate,
    by_kind_and_name,
    helm_template,
    kustomize,
    main_container,
    pod_spec,
)
from tests.realtools import require_tool

pytestmark = pytest.mark.integration

ON = {"devicePluginHealth": {"enabled": True}}


@pytest.mark.parametrize(
    ("components", "values"),
    [
        (("device-plugin-health",), ON),
        (("pod-attribution", "device-plugin-health"), {**ON, "podAttribution": {"enabled": True}}),
    ],
    ids=["alone", "with-pod-attribution"],
)
def test_the_value_renders_what_the_kustomize_component_does(
    tmp_path: Path, components: tuple[str, ...], values: dict[str, Any]
) -> None:
    helm_objects = by_kind_and_name(helm_template(tmp_path, values))
    kustomize_objects = by_kind_and_name(kustomize(tmp_path, components))
    kustomize_objects.pop(("Namespace", NAMESPACE))
    assert helm_objects.keys() == kustomize_objects.keys()
    for key, expected in kustomize_objects.items():
        assert helm_objects[key] == expected, key


def test_the_daemonset_serves_the_socket_the_plugin_asks_in_the_folder_it_mounts(tmp_path: Path) -> None:
    off = helm_template(tmp_path)
    assert not any("--device-plugin.socket" in arg for arg in main_container(off)["args"])
    rendered = helm_template(tmp_path, ON)
    container, pod = main_container(rendered), pod_spec(rendered)
    assert f"--device-plugin.socket={DME_HEALTH_SOCKET}" in container["args"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "amd-metrics-exporter"]
    assert mount == {"name": "amd-metrics-exporter", "mountPath": "/var/lib/amd-metrics-exporter"}
    (volume,) = [v for v in pod["volumes"] if v["name"] == "amd-metrics-exporter"]
    assert volume["hostPath"] == {"path": "/var/lib/amd-metrics-exporter", "type": "DirectoryOrCreate"}
    # uid 0 (the folder is root's) and still nothing else: no capability, no escalation, read-only root
    security = container["securityContext"]
    assert security["runAsUser"] == 0 and pod["securityContext"]["runAsUser"] == 0
    assert security["capabilities"] == {"drop": ["ALL"]} and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True and security["privileged"] is False
    # the daemon takes the flag as rendered
    config = tmp_path / "config.yaml"
    config.write_text(f"device-plugin.socket: {DME_HEALTH_SOCKET}\n")
    check = subprocess.run(
        [require_tool("amdgpu-exporter"), "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_rendered_objects_pass_strict_schema_validation(tmp_path: Path, version: str) -> None:
    builtin = [o for o in helm_template(tmp_path, ON) if o["kind"] not in CRD_KINDS]
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    result = _validate(manifest, version)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(" passed for resource ") == len(builtin), result.stdout
