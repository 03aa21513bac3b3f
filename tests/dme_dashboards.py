"""How many of AMD device-metrics-exporter's dashboard queries answer here: a measurement, not a test.

    .venv/bin/python -m tests.dme_dashboards --dashboards DIR [--fleet MI300X:CPX ...]

DIR holds DME's Grafana dashboards (dashboard_gpu.json, _job, _node, _overview, _system from its
repository's grafana/ folder; not shipped here). For each fleet it starts the demo exporter at its
defaults with a Slurm job on GPU 0 (the shipped prolog) and a pod on another GPU (a fake kubelet's
pod-resources socket), and a real Prometheus scraping it with deploy/prometheus/dme-compat.rules.yml
and the documented target labels (node, cluster_name). It resolves the dashboards' template variables
as Grafana does (the first value of each label_values chain), runs every panel query once the rules
have a few samples, and sorts each into:

- profiler: a gpu_prof_* counter (rocprofiler's; left out),
- answered: a non-empty result,
- empty by right: every series the query selects exists, the query filters them all out (a health
  count `< 1` on a healthy node, the other ASIC branch of a card_model choice): DME on the same node
  answers nothing either (left out),
- not on this ASIC: a series it selects is missing because the kernel gives its source nothing on
  this ASIC (an MI300X has no edge sensor): DME reads the same driver (left out, listed),
- unanswered: a series it selects is missing here; the reason names it.

Prometheus 3's quoted metric names (`{"gpu_package_power", hostname="..."}`, in DME's system and gpu
dashboards) are rewritten to the classic form (`gpu_package_power{hostname="..."}`), the same query,
for Debian's Prometheus 2.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml

from exporter.exposition.dme_reference import DME_METRICS, RULES
from tests.fake_kubelet import FakeContainer, FakeKubelet, FakePod
from tests.realtools import free_port, require_tool

REPO = Path(__file__).resolve().parents[1]
PROLOG = REPO / "deploy" / "slurm" / "prolog.sh"
DASHBOARDS = ("gpu", "job", "node", "overview", "system")
NODE, CLUSTER, JOB, POD, NAMESPACE = "gpu-node-7", "demo-cluster", "4242", "train-0", "ml"
FLEETS = ("4xMI250X", "8xMI300X", "8xMI300X:CPX", "8xMI355X")
# Grafana's own variables, as a 2 s scrape needs them: two samples in every window.
GRAFANA = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m", "__range_s": "300", "__interval_ms": "60000"}
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
SOURCES = {metric.name: metric.source for metric in DME_METRICS if metric.source is not None}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "sum", "avg", "max", "min", "count"}


def panel_queries(dashboard: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def walk(panel: dict[str, Any]) -> None:
        found.extend(t["expr"] for t in panel.get("targets") or [] if t.get("expr"))
        for child in panel.get("panels") or []:
            walk(child)

    for panel in dashboard.get("panels", []):
        walk(panel)
    return found


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(body.get("error", response.text))
        result: list[dict[str, Any]] = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def label_values(self, label: str, match: str | None) -> list[str]:
        params = {"match[]": match} if match else {}
        response = httpx.get(f"{self.url}/api/v1/label/{label}/values", params=params, timeout=10)
        values: list[str] = response.json().get("data") or []
        return values


def classic(expr: str) -> str:
    """`{"name", matchers}` -> `name{matchers}`, `{"name"}` -> `name{}`."""
    return re.sub(r'\{\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"\s*,?\s*', r"\1{", expr)


def substitute(text: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, match.group(0))

    return re.sub(r"\$\{([A-Za-z_]+)(?::[a-z]+)?\}|\$([A-Za-z_]+)", one, text)


def resolve_variables(dashboard: dict[str, Any], prometheus: Prometheus) -> dict[str, str]:
    """Grafana's choice at load: each query variable's first value, in the listed order, resolved again
    until nothing changes (the list is not in dependency order)."""
    variables = dict(GRAFANA, g_metrics_prefix="")
    for _ in range(4):
        for variable in dashboard.get("templating", {}).get("list", []):
            query = variable.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            if variable.get("type") != "query" or not isinstance(query, str):
                continue
            match = re.fullmatch(r"\s*label_values\((?:(.*),\s*)?([A-Za-z_]+)\)\s*", substitute(query, variables))
            if not match:
                continue
            values = sorted(prometheus.label_values(match.group(2), match.group(1)))
            if variable.get("includeAll") and variable.get("multi") and values:
                # Grafana's "All": the values as one alternation
                variables[variable["name"]] = variable.get("allValue") or "(" + "|".join(map(re.escape, values)) + ")"
                continue
            preferred = {"job_id": JOB, "pod": POD, "hostname": NODE, "cluster_name": CLUSTER}.get(match.group(2))
            if preferred in values:
                values = [preferred]
            variables[variable["name"]] = values[0] if values else (variable.get("allValue") or ".*")
    return variables


def _selectors(expr: str) -> list[str]:
    return [f"{name}{{{matchers}}}" for name, matchers in _SELECTOR.findall(expr) if name not in _KEYWORDS]


def _without_card_model(selector: str) -> str:
    return re.sub(r',?\s*card_model\s*[!=~]+\s*"[^"]*"', "", selector).replace("{,", "{")


def classify(expr: str, prometheus: Prometheus) -> tuple[str, str]:
    if "gpu_prof_" in expr:
        return "profiler", ""
    try:
        # Two tries a second apart: on a loaded machine a missed scrape or rule evaluation can
        # leave a series out for a moment, which is not what is measured here.
        for attempt in range(2):
            if prometheus.query(expr):
                return "answered", ""
            time.sleep(1 if attempt == 0 else 0)
    except ValueError as error:
        return "unanswered", f"error: {error}"
    for selector in _selectors(expr):
        if prometheus.query(selector):
            continue
        if "card_model" in selector and prometheus.query(_without_card_model(selector)):
            continue  # the other ASIC's branch: empty on DME too for this card
        source = SOURCES.get(selector.split("{", 1)[0])
        if source is not None and not prometheus.query(source):
            return "not on this ASIC", selector.split("{", 1)[0]
        return "unanswered", selector
    return "empty by right", ""


def _ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(log.read_text(errors="replace"))
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready")


def measure(fleet: str, dashboards: dict[str, dict[str, Any]], work: Path, rules: Path = RULES) -> dict[str, Any]:
    state = work / "slurm"
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_GPUS": "0",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
    }
    subprocess.run(["bash", str(PROLOG)], env=env, check=True, capture_output=True, timeout=30)
    kubelet = FakeKubelet(str(work / "kubelet.sock"))
    kubelet._server.start()
    exporter_address = f"127.0.0.1:{free_port()}"
    prometheus_url = f"http://127.0.0.1:{free_port()}"
    config = {
        # 2 s: a scrape of a 64-partition node must not time out on a loaded machine (a missed scrape
        # leaves series out for a moment, which is not what is measured here).
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "amdgpu-exporter",
                "static_configs": [{"targets": [exporter_address], "labels": {"node": NODE, "cluster_name": CLUSTER}}],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    processes = []
    try:
        exporter_log = work / "exporter.log"
        exporter = subprocess.Popen(
            [
                require_tool("amdgpu-exporter"),
                "--demo",
                f"--demo.fleet={fleet}",
                "--demo.scenario=training",
                "--interval=1s",
                f"--slurm.state-dir={state}",
                "--kubernetes",
                f"--kubernetes.pod-resources-socket={kubelet.socket_path}",
                "--kubernetes.interval=1s",
                f"--web.listen-address={exporter_address}",
            ],
            stdout=exporter_log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        processes.append(exporter)
        _ready(f"http://{exporter_address}/readyz", exporter, exporter_log)
        devices = httpx.get(f"http://{exporter_address}/api/v1/devices", timeout=10).json()["devices"]
        # The pod holds the last socket's partition 0 (the device plugin's id for it is the BDF).
        held = [d for d in devices if d["identity"]["partition"] == 0 and d["gpu"] != 0][-1]
        kubelet.set_pods(
            [FakePod(POD, NAMESPACE, [FakeContainer("trainer", {"amd.com/gpu": [held["identity"]["pci_bus_id"]]})])]
        )
        prometheus_log = work / "prometheus.log"
        prometheus_process = subprocess.Popen(
            [
                require_tool("prometheus"),
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address={prometheus_url.removeprefix('http://')}",
            ],
            stdout=prometheus_log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        processes.append(prometheus_process)
        _ready(f"{prometheus_url}/-/ready", prometheus_process, prometheus_log)
        prometheus = Prometheus(prometheus_url)
        deadline = time.monotonic() + 120
        ready = (
            "count_over_time(gpu_gfx_busy_instantaneous[1m]) > 5"
            f' and on () count_over_time(amdgpu_allocation_info{{pod="{POD}"}}[1m]) > 5'
        )
        while not prometheus.query(ready):
            if time.monotonic() > deadline:
                raise RuntimeError("the compat rules or the pod's attribution never had five samples")
            time.sleep(0.5)
        added = prometheus.query('count({__name__=~"gpu_.*|pcie_.*|gpu:amdgpu_device_info:dme_labels"})')
        served = prometheus.query('count({__name__=~"amdgpu_.*", job="amdgpu-exporter"})')
        results: dict[str, Any] = {
            "_series": (added[0]["value"][1] if added else "0", served[0]["value"][1] if served else "0")
        }
        for name, dashboard in dashboards.items():
            variables = resolve_variables(dashboard, prometheus)
            rows = [
                (expr, *classify(classic(substitute(expr, variables)), prometheus)) for expr in panel_queries(dashboard)
            ]
            results[name] = rows
        return results
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)
        kubelet._server.stop(0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboards", type=Path, required=True, help="folder of DME's dashboard_*.json")
    parser.add_argument("--fleet", action="append", help=f"demo fleets (default: {', '.join(FLEETS)})")
    parser.add_argument("--rules", type=Path, default=RULES, help="the compat rule file (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="list every unanswered query and why")
    args = parser.parse_args(argv)
    dashboards = {
        name: json.loads((args.dashboards / f"dashboard_{name}.json").read_text(encoding="utf-8"))
        for name in DASHBOARDS
    }
    for fleet in args.fleet or FLEETS:
        with tempfile.TemporaryDirectory(prefix="dme-dashboards-") as work:
            results = measure(fleet, dashboards, Path(work), args.rules.resolve())
        added, served = results.pop("_series")
        total: Counter[str] = Counter()
        parts = []
        for name, rows in results.items():
            counts = Counter(kind for _, kind, _ in rows)
            total.update(counts)
            parts.append(f"{name} {counts['answered']}/{counts['answered'] + counts['unanswered']}")
        applicable = total["answered"] + total["unanswered"]
        print(
            f"{fleet}: {total['answered']} of {applicable} applicable queries answer ({'; '.join(parts)}); "
            f"left out: {total['profiler']} profiler, {total['empty by right']} empty by right, "
            f"{total['not on this ASIC']} not on this ASIC; the rules add {added} series to the {served} served"
        )
        absent = Counter(reason for rows in results.values() for _, kind, reason in rows if kind == "not on this ASIC")
        for reason, count in absent.most_common():
            print(f"  {count:3d} x not on this ASIC: {reason}")
        reasons = Counter(reason for rows in results.values() for _, kind, reason in rows if kind == "unanswered")
        for reason, count in reasons.most_common():
            print(f"  {count:3d} x missing {reason}")
        if args.verbose:
            for name, rows in results.items():
                for expr, kind, reason in rows:
                    if kind != "answered":
                        print(f"  [{name}] {kind}: {expr}  <- {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
