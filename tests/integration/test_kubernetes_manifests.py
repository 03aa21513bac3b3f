"""deploy/kubernetes: rendered by real kustomize, validated against Kubernetes' schemas, and held to
the daemon's real command line.

kustomize: `kubectl kustomize` (kubectl embeds kustomize). Built-in kinds: kubernetes-validate in
strict mode (unknown fields are errors). The Prometheus Operator's CRDs have no schema here:
the PrometheusRule's groups go through `promtool check rules`, the ServiceMonitor is checked
against the Service it must select. Probes, ports and paths are checked against a real daemon
started with the DaemonSet's own arguments and environment.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from exporter import __version__
from tests.harness import free_port
from tests.realtools import require_tool

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_DIR = REPO / "deploy" / "kubernetes"
PROMETHEUS_RULES = REPO / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml"
SHIPPED_DAEMON_RULES = REPO / "exporter" / "alerting" / "default_rules.yaml"
DOCKERFILE = REPO / "Dockerfile"
NAMESPACE = "amdgpu-exporter"
# 1.30: the first release whose API has volumeMounts[].recursiveReadOnly (the /sys mount uses it);
# None: kubernetes-validate's newest schemas.
KUBERNETES_VERSIONS = ("1.30.0", None)
EXPECTED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "DaemonSet",
    "ServiceMonitor",
    "PrometheusRule",
}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    result = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE_DIR)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind]
    assert len(matches) == 1, f"expected one {kind}, found {len(matches)}"
    return matches[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return dict(only)


def flag_value(args: list[str], flag: str, default: str) -> str:
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(flag + "=")]
    return values[-1] if values else default


def dockerfile_exec_form(keyword: str) -> list[str]:
    text = DOCKERFILE.read_text()
    (line,) = re.findall(rf"^{keyword}\s+(\[.*\])\s*$", text, re.MULTILINE)[-1:]
    return [str(item) for item in json.loads(line)]


def render_with_component(tmp_path: Path, component: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` of a copy of deploy/kubernetes with `component` uncommented, as the README says."""
    overlay = tmp_path / "kubernetes"
    shutil.copytree(KUSTOMIZE_DIR, overlay)
    kustomization = overlay / "kustomization.yaml"
    text = kustomization.read_text()
    commented = f"#   - {component}\n"
    assert "\n# components:\n" in text and commented in text, "the README tells users to uncomment these lines"
    kustomization.write_text(
        text.replace("\n# components:\n", "\ncomponents:\n").replace(commented, f"  - {component}\n")
    )
    result = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _validate(path: Path, version: str | None) -> subprocess.CompletedProcess[str]:
    command = [require_tool("kubernetes-validate"), "--strict"]
    if version:
        command += ["--kubernetes-version", version]
    return subprocess.run([*command, str(path)], capture_output=True, text=True, timeout=120)


# --- Rendering and schemas -----------------------------------------------------------------------


def test_kustomize_renders_every_object_in_the_namespace(rendered: list[dict[str, Any]]) -> None:
    assert {o["kind"] for o in rendered} == EXPECTED_KINDS
    for obj in rendered:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == NAMESPACE, obj["metadata"]
    assert one(rendered, "Namespace")["metadata"]["name"] == NAMESPACE


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS, ids=lambda v: v or "latest")
def test_builtin_objects_pass_strict_schema_validation(
    rendered: list[dict[str, Any]], version: str | None, tmp_path: Path
) -> None:
    builtin = [o for o in rendered if o["kind"] not in CRD_KINDS]
    manifest = tmp_path / "builtin.yaml"
    manifest.write_text(yaml.safe_dump_all(builtin, sort_keys=False))
    result = _validate(manifest, version)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARN" not in result.stdout and "ERROR" not in result.stdout, result.stdout
    assert result.stdout.count(" passed for resource ") == len(builtin), result.stdout

    # Strict mode is on: one misspelt field in the DaemonSet is an error.
    daemonset = json.loads(json.dumps(one(rendered, "DaemonSet")))
    security = daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    security["readOnlyRootFileSystem"] = security.pop("readOnlyRootFilesystem")
    manifest.write_text(yaml.safe_dump(daemonset))
    result = _validate(manifest, version)
    assert result.returncode != 0 and "readOnlyRootFileSystem" in result.stdout, result.stdout


def test_pod_attribution_component_mounts_the_socket_folder_read_only_as_uid_0_without_capabilities(
    tmp_path: Path,
) -> None:
    objects = render_with_component(tmp_path, "pod-attribution")
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    main = container(objects)
    # The socket is root:root 0755 and connect(2) needs write permission: uid 0, and nothing more.
    assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    security = main["securityContext"]
    assert security["runAsUser"] == 0
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    # No `type: Directory`: a kubelet with another --root-dir must not keep the pod from starting.
    assert volumes[mount["name"]]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources"}
    assert "--kubernetes" in main["args"]
    socket_path = flag_value(main["args"], "--kubernetes.pod-resources-socket", "")
    assert str(PurePosixPath(socket_path).parent) == mount["mountPath"]
    manifest = tmp_path / "daemonset.yaml"
    manifest.write_text(yaml.safe_dump(one(objects, "DaemonSet")))
    validated = _validate(manifest, None)
    assert validated.returncode == 0 and "ERROR" not in validated.stdout, validated.stdout


WEB_SECRET = "amdgpu-exporter-web"  # mounted: web-config.yml, tls.crt, tls.key, ca.crt
SCRAPE_SECRET = "amdgpu-exporter-scrape"  # the Operator's only: username, password


def test_web_config_component_serves_https_with_basic_auth_and_the_servicemonitor_verifies_it(
    tmp_path: Path,
) -> None:
    """The web-config component renders, validates, and does what it promises: the daemon started
    with its args and a Secret laid out as its comment says answers the probes over HTTPS without a
    password, and /metrics only to the ServiceMonitor's scrape (CA, serverName and basic auth)."""
    objects = render_with_component(tmp_path / "render", "web-config")
    daemonset = one(objects, "DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    main = container(objects)
    manifest = tmp_path / "daemonset.yaml"
    manifest.write_text(yaml.safe_dump(daemonset))
    for version in KUBERNETES_VERSIONS:
        validated = _validate(manifest, version)
        assert validated.returncode == 0 and "ERROR" not in validated.stdout, validated.stdout

    # Args, mount and volume: the file the flag names is in the Secret, mounted read-only.
    config_path = PurePosixPath(flag_value(main["args"], "--web.config.file", ""))
    assert config_path.name == "web-config.yml"
    mount = next(m for m in main["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"] == {"secretName": WEB_SECRET, "defaultMode": 0o440}
    # 0440: readable by the exporter only through fsGroup, which must be its own group.
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Probes: the same paths and port, over HTTPS; nothing else about them changes.
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTPS"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTPS"}
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["port"] == "metrics"
    tls = endpoint["tlsConfig"]
    assert tls["insecureSkipVerify"] is False
    assert tls["ca"] == {"secret": {"name": WEB_SECRET, "key": "ca.crt"}}
    server_name = tls["serverName"]
    assert endpoint["basicAuth"] == {
        "username": {"name": SCRAPE_SECRET, "key": "username"},
        "password": {"name": SCRAPE_SECRET, "key": "password"},
    }
    assert SCRAPE_SECRET not in json.dumps(daemonset), "the clear password never reaches the exporter's pod"

    # The Secret as the component's comment lays it out, and the daemon started with the pod's args.
    from tests.webtls import bcrypt_hash, make_pki, server_certificate

    pki = make_pki(tmp_path / "pki")
    cert, key = server_certificate(pki.folder, "svc", server_name)
    secret = tmp_path / "secret"
    secret.mkdir()
    for source, name in ((cert, "tls.crt"), (key, "tls.key"), (pki.ca, "ca.crt")):
        shutil.copyfile(source, secret / name)
    password = "scrape-secret"
    (secret / config_path.name).write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},  # relative, as documented
                "basic_auth_users": {"prometheus": bcrypt_hash(password, rounds=4)},
            }
        )
    )
    port = free_port()
    args = [a for a in main["args"] if not a.startswith(("--web.listen-address=", "--web.config.file="))]
    args += ["--demo", f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={secret / config_path.name}"]
    log_path = tmp_path / "exporter.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", *args],
            env={"PATH": os.environ["PATH"]},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    kubelet = ssl.create_default_context()  # the kubelet's HTTPS probes verify nothing
    kubelet.check_hostname = False
    kubelet.verify_mode = ssl.CERT_NONE
    prometheus = ssl.create_default_context(cafile=str(secret / "ca.crt"))
    authorization = "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()
    try:
        probes = [main["livenessProbe"]["httpGet"]["path"], main["readinessProbe"]["httpGet"]["path"]]
        deadline = time.monotonic() + 30
        while probes:
            assert process.poll() is None, f"exited with {process.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"{probes} never answered 200:\n{log_path.read_text()}"
            with contextlib.suppress(OSError):
                probes = [p for p in probes if _https_status(port, kubelet, "localhost", p) != 200]
            time.sleep(0.2)
        scrape = endpoint["path"]
        assert _https_status(port, prometheus, server_name, scrape, authorization) == 200
        assert _https_status(port, prometheus, server_name, scrape) == 401
        assert _https_status(port, kubelet, "localhost", scrape) == 401
        with pytest.raises(ssl.SSLCertVerificationError):  # the certificate names serverName only
            _https_status(port, prometheus, "localhost", scrape, authorization)
    finally:
        process.terminate()
        process.wait(timeout=20)


def _https_status(port: int, context: ssl.SSLContext, server_name: str, path: str, authorization: str = "") -> int:
    """One HTTPS GET to 127.0.0.1:port with TLS for `server_name` (what a ServiceMonitor's serverName does)."""
    headers = f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n"
    if authorization:
        headers += f"Authorization: {authorization}\r\n"
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as tls,
    ):
        tls.sendall((headers + "\r\n").encode())
        status_line = tls.makefile("rb").readline().decode()
    return int(status_line.split()[1])


# --- Generated objects ---------------------------------------------------------------------------


def test_committed_prometheusrule_is_the_generators_output() -> None:
    result = subprocess.run(
        [sys.executable, str(KUSTOMIZE_DIR / "generate_prometheusrule.py"), "--stdout"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    committed = (KUSTOMIZE_DIR / "prometheusrule.yaml").read_text()
    assert committed == result.stdout, "run: python3 deploy/kubernetes/generate_prometheusrule.py"


def test_prometheusrule_groups_pass_promtool_and_equal_the_source(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    promtool = require_tool("promtool")
    groups = one(rendered, "PrometheusRule")["spec"]["groups"]
    health = PROMETHEUS_RULES.with_name("amdgpu-health.rules.yml")
    jobs = PROMETHEUS_RULES.with_name("amdgpu-jobs.rules.yml")
    sources = [yaml.safe_load(path.read_text())["groups"] for path in (PROMETHEUS_RULES, health, jobs)]
    assert groups == [group for source in sources for group in source]
    extracted = tmp_path / "extracted.rules.yml"
    extracted.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False, allow_unicode=True))
    result = subprocess.run([promtool, "check", "rules", str(extracted)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(group["rules"]) for group in groups)
    assert f"{rules} rules found" in result.stdout, result.stdout


def test_rules_configmap_carries_the_shipped_daemon_rules(rendered: list[dict[str, Any]]) -> None:
    copy = KUSTOMIZE_DIR / "default-rules.yaml"
    assert copy.read_bytes() == SHIPPED_DAEMON_RULES.read_bytes(), (
        "run: cp exporter/alerting/default_rules.yaml deploy/kubernetes/default-rules.yaml"
    )
    configmap = one(rendered, "ConfigMap")
    env = {e["name"]: e.get("value") for e in container(rendered).get("env", [])}
    rules_path = PurePosixPath(env["AMDGPU_EXPORTER_RULES_FILE"])
    assert configmap["data"][rules_path.name] == SHIPPED_DAEMON_RULES.read_text()
    # The DaemonSet mounts that ConfigMap (by its hashed name) at the folder the variable names.
    pod = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v.get("configMap", {}).get("name") == configmap["metadata"]["name"]]
    (mount,) = [m for m in container(rendered)["volumeMounts"] if m["name"] == volume["name"]]
    assert PurePosixPath(mount["mountPath"]) == rules_path.parent and mount["readOnly"] is True


# --- The pod's contract --------------------------------------------------------------------------


def test_daemonset_runs_only_on_amd_gpu_nodes_and_tolerates_their_taints(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    selected = {(e["key"], e["operator"], tuple(e["values"])) for t in terms for e in t["matchExpressions"]}
    assert ("feature.node.kubernetes.io/amd-gpu", "In", ("true",)) in selected
    assert ("amd.com/gpu.present", "In", ("true",)) in selected
    assert all(len(t["matchExpressions"]) == 1 for t in terms), "each label alone must select a node"
    tolerated = {t["key"] for t in pod["tolerations"] if t["operator"] == "Exists" and "effect" not in t}
    assert "amd.com/gpu" in tolerated


def test_pod_is_unprivileged_and_reads_the_host_read_only(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "DaemonSet")["spec"]["template"]["spec"]
    main = container(rendered)
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))
    assert pod["automountServiceAccountToken"] is False
    assert one(rendered, "ServiceAccount")["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == one(rendered, "ServiceAccount")["metadata"]["name"]
    pod_security = pod["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert 44 in pod_security["supplementalGroups"], "video (44 on Debian/Ubuntu) from the GID patch"
    assert len(pod_security["supplementalGroups"]) == 2, "video and render"
    security = main["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security.get("privileged", False) is False
    assert security["capabilities"] == {"drop": ["ALL"]}

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    host_paths = {v["hostPath"]["path"]: name for name, v in volumes.items() if "hostPath" in v}
    # The kubelet's pod-resources folder only with the pod-attribution component (its own test).
    assert set(host_paths) == {"/sys"}
    for mount in main["volumeMounts"]:
        if "hostPath" in volumes[mount["name"]]:
            assert mount.get("readOnly") is True, mount
    shm = volumes[mounts["/dev/shm"]["name"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    sysfs_mount = next(m for m in main["volumeMounts"] if m["name"] == host_paths["/sys"])
    assert flag_value(main["args"], "--path.sysfs", "/sys") == sysfs_mount["mountPath"]

    resources = main["resources"]
    assert resources["requests"] == {"cpu": "50m", "memory": "128Mi"}
    assert resources["limits"] == {"cpu": "500m", "memory": "256Mi"}


def test_ports_probes_service_and_servicemonitor_agree_with_the_daemon_flags(
    rendered: list[dict[str, Any]],
) -> None:
    main = container(rendered)
    listen_port = int(flag_value(main["args"], "--web.listen-address", ":9442").rsplit(":", 1)[1])
    telemetry_path = flag_value(main["args"], "--web.telemetry-path", "/metrics")
    assert listen_port == 9442
    (port,) = main["ports"]
    assert port == {"name": "metrics", "containerPort": listen_port, "hostPort": listen_port, "protocol": "TCP"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}

    service = one(rendered, "Service")
    assert service["spec"]["clusterIP"] == "None"
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == listen_port and service_port["targetPort"] == "metrics"
    pod_labels = one(rendered, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()

    monitor = one(rendered, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service_port["name"]
    assert endpoint["path"] == telemetry_path
    interval = float(endpoint["interval"].rstrip("s"))
    assert float(endpoint["scrapeTimeout"].rstrip("s")) < interval


def test_daemonset_runs_the_dockerfiles_entrypoint_with_its_cmd(rendered: list[dict[str, Any]]) -> None:
    main = container(rendered)
    assert "command" not in main, "the image's ENTRYPOINT is the command"
    assert main["args"] == dockerfile_exec_form("CMD")
    assert PurePosixPath(dockerfile_exec_form("ENTRYPOINT")[0]).name == "amdgpu-exporter"


def test_image_is_named_once_by_the_kustomizations_images_entry(rendered: list[dict[str, Any]]) -> None:
    """daemonset.yaml names the image by its bare name only; kustomization.yaml's one `images:`
    entry gives registry and tag (what `kustomize edit set image` rewrites), the tag being the
    exporter's version."""
    kustomization = yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text())
    (entry,) = kustomization["images"]
    assert set(entry) == {"name", "newName", "newTag"}, entry
    assert entry["newTag"] == __version__, "the image tag follows exporter.__version__"
    assert "/" in entry["newName"], "newName must name a registry, or nodes pull from Docker Hub"
    assert container(rendered)["image"] == f"{entry['newName']}:{entry['newTag']}"
    named = {
        path.name: re.findall(r"^\s*image:\s*(\S+)", path.read_text(), re.MULTILINE)
        for path in sorted(KUSTOMIZE_DIR.glob("*.yaml"))
        if path.name != "kustomization.yaml"
    }
    assert {name: images for name, images in named.items() if images} == {"daemonset.yaml": [entry["name"]]}


# --- The daemon behind the probes ----------------------------------------------------------------


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


KUBELET_NODE_NAME = "gpu-node-k8s-7"  # what the kubelet puts in a spec.nodeName fieldRef in these tests


def _downward_api(entry: dict[str, Any]) -> str:
    field = entry["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "spec.nodeName", f"{entry['name']}: a fieldRef this test does not know: {field}"
    return KUBELET_NODE_NAME


def test_pushed_alerts_name_the_kubernetes_node_not_the_pod(rendered: list[dict[str, Any]]) -> None:
    """docs/alert-labels.md: `node` on pushed alerts is the node name from the downward API, in the
    variable the daemon reads for --node-name."""
    from exporter.config import OPTIONS

    (node_option,) = [o for o in OPTIONS if o.name == "node-name"]
    env = {e["name"]: e for e in container(rendered).get("env", [])}
    assert env[node_option.env]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_daemon_started_like_the_pod_answers_its_probes(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The DaemonSet's args and env (rules file from the ConfigMap), with --demo for a GPU and a
    loopback port: the liveness and readiness paths and the scrape path answer 200."""
    main = container(rendered)
    configmap = one(rendered, "ConfigMap")
    port = free_port()
    env = {e["name"]: e["value"] if "value" in e else _downward_api(e) for e in main.get("env", [])}
    rules_path = PurePosixPath(env["AMDGPU_EXPORTER_RULES_FILE"])
    rules_copy = tmp_path / rules_path.name
    rules_copy.write_text(configmap["data"][rules_path.name])
    env["AMDGPU_EXPORTER_RULES_FILE"] = str(rules_copy)
    args = [a for a in main["args"] if not a.startswith(("--web.listen-address=", "--path.sysfs="))]
    args += ["--demo", f"--web.listen-address=127.0.0.1:{port}"]
    log_path = tmp_path / "exporter.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", *args],
            env={"PATH": os.environ["PATH"], **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    probes = [main["livenessProbe"]["httpGet"]["path"], main["readinessProbe"]["httpGet"]["path"]]
    scrape = one(rendered, "ServiceMonitor")["spec"]["endpoints"][0]["path"]
    try:
        pending = [*probes, scrape]
        deadline = time.monotonic() + 30
        while pending:
            assert process.poll() is None, f"exited with {process.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"{pending} never answered 200:\n{log_path.read_text()}"
            with contextlib.suppress(OSError):  # not listening yet
                pending = [path for path in pending if _status(f"http://127.0.0.1:{port}{path}") != 200]
            time.sleep(0.2)
    finally:
        process.terminate()
        process.wait(timeout=20)


def test_generator_rejects_a_rules_file_without_groups() -> None:
    spec = importlib.util.spec_from_file_location(
        "generate_prometheusrule", KUSTOMIZE_DIR / "generate_prometheusrule.py"
    )
    assert spec is not None and spec.loader is not None
    generate_prometheusrule = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate_prometheusrule)
    with pytest.raises(ValueError, match="groups"):
        generate_prometheusrule.render_prometheusrule("rules: []\n", "bad.yml")
    text = generate_prometheusrule.render_prometheusrule(PROMETHEUS_RULES.read_text(), "x.yml")
    assert yaml.safe_load(text)["spec"]["groups"] == yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"]


def test_generator_prefixes_runbook_urls_with_a_base(tmp_path: Path) -> None:
    """--runbook-base makes every alert's runbook_url a link to the given copy of docs/runbooks.md."""
    base = "https://git.example.org/ops/amdgpu-exporter/blob/v1/"
    result = subprocess.run(
        [sys.executable, str(KUSTOMIZE_DIR / "generate_prometheusrule.py"), "--stdout", f"--runbook-base={base}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load(result.stdout)["spec"]["groups"]
    health = PROMETHEUS_RULES.with_name("amdgpu-health.rules.yml")
    jobs = PROMETHEUS_RULES.with_name("amdgpu-jobs.rules.yml")
    shipped = [g for path in (PROMETHEUS_RULES, health, jobs) for g in yaml.safe_load(path.read_text())["groups"]]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
    relative = [r["annotations"]["runbook_url"] for g in shipped for r in g["rules"] if "alert" in r]
    assert urls == [base + url for url in relative] and all(url.startswith("docs/runbooks.md#") for url in relative)
    # Nothing else changes; a base that is not a folder URL is one clear error.
    strip = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]
    assert strip == [
        {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in shipped
    ]
    bad = subprocess.run(
        [sys.executable, str(KUSTOMIZE_DIR / "generate_prometheusrule.py"), "--stdout", "--runbook-base=https://x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "ending in '/'" in bad.stderr
