"""Two-tier layouts from deploy/prometheus/fleet/, run with Debian's binaries: Prometheus agents per
shard remote-writing to a central Prometheus and to VictoriaMetrics (with vmalert evaluating the
shipped rules there), against a single Prometheus scraping the same demo exporters.

Checked: the shipped rules load and evaluate at the centre and in vmalert (agents run none), and
every query of the shipped dashboards (variables substituted) returns the same series, with values
equal within the exporters' motion between two scrapes, from the central Prometheus and from
VictoriaMetrics as from the single Prometheus. The exporters run the idle scenario so that values
move little between the stores' scrapes; intervals are 1 s instead of the files' 15 s to keep the
run short.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.harness import wait_until
from tests.integration.test_grafana_dashboards import (
    DASHBOARDS,
    EXPORTER,
    all_value,
    queries,
    query_variables,
    stop,
    substitute,
    variable_defaults,
)
from tests.realtools import free_port, require_tool

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "prometheus" / "fleet"
# node name -> demo fleet; the two shards scrape one node each
NODES = {"gpu-a": "4xMI250X", "gpu-b": "2xMI300X"}
INTERVAL = "1s"
# Samples reach the centre within the agents' batch deadline, VictoriaMetrics within its latency
# offset: queries look this far back so that every store holds the same samples.
QUERY_LAG = 8.0
# How much a value may differ between two stores: they scrape the same exporter at different
# instants, and the idle demo still moves temperatures by a degree and counters by their rate.
RELATIVE = 0.10
ABSOLUTE = 0.02
# Queries over sample age (time() - x, timestamp(x) - x) differ by the scrape phase, up to an interval.
AGE_ABSOLUTE = 2.5

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@dataclass
class Processes:
    work: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")[-3000:]


class Store:
    """A store answering PromQL over HTTP (Prometheus or VictoriaMetrics)."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url
        self.client = httpx.Client(base_url=url, timeout=30)

    def query(self, expr: str, at: float) -> dict[str, Any]:
        body = self.client.post("/api/v1/query", data={"query": expr, "time": f"{at:.3f}"}).json()
        assert body.get("status") == "success", f"{self.name}: {expr}\n-> {body.get('errorType')}: {body.get('error')}"
        return dict(body["data"])

    def label_values(self, selector: str, label: str) -> list[str]:
        body = self.client.get("/api/v1/series", params={"match[]": selector, "start": str(time.time() - 300)}).json()
        assert body.get("status") == "success", f"{self.name}: {selector}: {body.get('error')}"
        return sorted({series[label] for series in body["data"] if label in series})


@dataclass
class Stack:
    reference: Store
    central: Store
    victoria: Store
    vmalert: httpx.Client
    agent_configs: list[dict[str, Any]]
    rule_files: list[Path]


def _yaml(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _targets(ports: dict[str, int], names: list[str]) -> list[dict[str, Any]]:
    # every target on 127.0.0.1: the node label is set per target, as the files' comment allows
    return [{"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}} for n in names]


def _recorded_names(rule_files: list[Path]) -> list[str]:
    names = []
    for path in rule_files:
        for group in _yaml(path)["groups"]:
            names += [rule["record"] for rule in group["rules"] if "record" in rule]
    return names


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus = require_tool("prometheus")
    victoria_metrics = require_tool("victoria-metrics")
    vmalert = require_tool("vmalert")
    assert EXPORTER.exists(), f"{EXPORTER} is missing: pip install -e . into .venv"
    work = tmp_path_factory.mktemp("two-tier")
    procs = Processes(work)
    try:
        ports = {name: free_port() for name in NODES}
        for name, fleet in NODES.items():
            procs.start(
                f"exporter-{name}",
                [
                    str(EXPORTER),
                    "--demo",
                    f"--demo.fleet={fleet}",
                    "--demo.scenario=idle",
                    f"--web.listen-address=127.0.0.1:{ports[name]}",
                ],
            )

        central_file = _yaml(FLEET / "central.yml")
        # The shipped files, but every group at the test's interval: a group's own `interval: 5m`
        # would first evaluate at an offset of up to 5 minutes, past what the tests wait.
        rule_files = []
        for name in central_file["rule_files"]:
            shipped = _yaml((FLEET / name).resolve())
            for group in shipped["groups"]:
                group.pop("interval", None)
            copy = work / Path(name).name
            copy.write_text(yaml.safe_dump(shipped, sort_keys=False), encoding="utf-8")
            rule_files.append(copy)

        vm_port = free_port()
        victoria_process = procs.start(
            "victoria-metrics",
            [
                victoria_metrics,
                f"-storageDataPath={work / 'vm-data'}",
                f"-httpListenAddr=127.0.0.1:{vm_port}",
                "-search.latencyOffset=1s",
                "-search.disableCache",
            ],
        )
        victoria = Store("victoria-metrics", f"http://127.0.0.1:{vm_port}")

        central_file["global"]["evaluation_interval"] = INTERVAL
        central_file["rule_files"] = [str(p) for p in rule_files]
        (work / "central.yml").write_text(yaml.safe_dump(central_file))
        central_port = free_port()
        central_process = procs.start(
            "central",
            [
                prometheus,
                f"--config.file={work / 'central.yml'}",
                "--web.enable-remote-write-receiver",
                f"--storage.tsdb.path={work / 'central-data'}",
                f"--web.listen-address=127.0.0.1:{central_port}",
            ],
        )
        central = Store("central prometheus", f"http://127.0.0.1:{central_port}")

        vmalert_port = free_port()
        vmalert_process = procs.start(
            "vmalert",
            [
                vmalert,
                *(f"-rule={p}" for p in rule_files),
                f"-datasource.url={victoria.url}",
                f"-remoteWrite.url={victoria.url}",
                f"-remoteRead.url={victoria.url}",
                # no Alertmanager here: notifications fail and are logged, evaluation goes on
                f"-notifier.url=http://127.0.0.1:{free_port()}",
                f"-evaluationInterval={INTERVAL}",
                f"-httpListenAddr=127.0.0.1:{vmalert_port}",
            ],
        )

        agent_file = _yaml(FLEET / "shard-agent.yml")
        agent_configs = []
        for shard, name in enumerate(NODES):
            config = _yaml(FLEET / "shard-agent.yml")
            config["global"] |= {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL}
            config["scrape_configs"][0]["static_configs"] = _targets(ports, [name])
            central_write, victoria_write = config["remote_write"]
            central_write["url"] = f"{central.url}/api/v1/write"
            victoria_write["url"] = f"{victoria.url}/api/v1/write"
            for write in config["remote_write"]:
                write.setdefault("queue_config", {})["batch_send_deadline"] = INTERVAL
            (work / f"agent-{shard}.yml").write_text(yaml.safe_dump(config))
            agent_configs.append(config)
            procs.start(
                f"agent-{shard}",
                [
                    prometheus,
                    "--enable-feature=agent",
                    f"--config.file={work / f'agent-{shard}.yml'}",
                    f"--storage.agent.path={work / f'agent-{shard}-data'}",
                    f"--web.listen-address=127.0.0.1:{free_port()}",
                ],
            )

        # The single Prometheus: the agents' scrape job over every node, the centre's rules.
        single_job = dict(agent_file["scrape_configs"][0], static_configs=_targets(ports, list(NODES)))
        single = {
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [single_job],
        }
        (work / "single.yml").write_text(yaml.safe_dump(single))
        single_port = free_port()
        single_process = procs.start(
            "single",
            [
                prometheus,
                f"--config.file={work / 'single.yml'}",
                f"--storage.tsdb.path={work / 'single-data'}",
                f"--web.listen-address=127.0.0.1:{single_port}",
            ],
        )
        reference = Store("single prometheus", f"http://127.0.0.1:{single_port}")
        vmalert_client = httpx.Client(base_url=f"http://127.0.0.1:{vmalert_port}", timeout=30)

        recorded = _recorded_names(rule_files)
        devices = {"4xMI250X": 8, "2xMI300X": 2}
        expected_up = sum(devices[f] for f in NODES.values())

        def filled(store: Store, process: subprocess.Popen[bytes]) -> None:
            def check() -> bool:
                result = store.query("count(count_over_time(amdgpu_up[1m]) >= 15)", time.time() - QUERY_LAG)["result"]
                if not result or int(float(result[0]["value"][1])) != expected_up:
                    return False
                # Every recorded series the reference has, chained ones included (a rule reading a
                # series recorded by another rule sees it one evaluation and one ingestion later).
                at = time.time() - QUERY_LAG
                names = "|".join(recorded)
                have = {
                    r["metric"]["__name__"]
                    for r in store.query(f'count by (__name__) ({{__name__=~"{names}"}})', at)["result"]
                }
                want = {
                    r["metric"]["__name__"]
                    for r in reference.query(f'count by (__name__) ({{__name__=~"{names}"}})', at)["result"]
                }
                return bool(want) and want <= have

            try:
                wait_until(
                    check, f"{store.name}: 15 s of samples of every device and a recorded series", 120, process, 0.2
                )
            except pytest.fail.Exception as failure:
                logs = "\n".join(f"--- {n} ---\n{procs.log(n)}" for n in ("central", "vmalert", "agent-0", "single"))
                raise AssertionError(f"{failure}\n{logs}") from None

        filled(reference, single_process)
        filled(central, central_process)
        filled(victoria, victoria_process)
        assert vmalert_process.poll() is None, procs.log("vmalert")
        yield Stack(reference, central, victoria, vmalert_client, agent_configs, rule_files)
        for store in (reference, central, victoria):
            store.client.close()
        vmalert_client.close()
    finally:
        for process in reversed(procs.started):
            if process.poll() is None:
                stop(process)


def _rule_groups(rule_files: list[Path]) -> dict[str, int]:
    return {group["name"]: len(group["rules"]) for path in rule_files for group in _yaml(path)["groups"]}


def test_fleet_configs_are_valid() -> None:
    promtool = require_tool("promtool")
    agent = _yaml(FLEET / "shard-agent.yml")
    assert "rule_files" not in agent, "agent mode evaluates no rules: the shipped rules belong at the centre"
    checks = [["--agent", "shard-agent.yml"], ["central.yml"], ["shard-rules.yml"]]
    for args in checks:
        result = subprocess.run(
            [promtool, "check", "config", *args], cwd=FLEET, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, f"promtool check config {' '.join(args)}:\n{result.stdout}{result.stderr}"
    shipped = {(ROOT / "deploy" / "prometheus" / "amdgpu-exporter.rules.yml").resolve()}
    for name in ("central.yml", "shard-rules.yml"):
        assert {(FLEET / f).resolve() for f in _yaml(FLEET / name)["rule_files"]} == shipped, name


def test_shipped_rules_evaluate_at_the_centre(stack: Stack) -> None:
    expected = _rule_groups(stack.rule_files)

    def evaluated() -> bool:
        groups = stack.central.client.get("/api/v1/rules").json()["data"]["groups"]
        return {g["name"]: len(g["rules"]) for g in groups} == expected and all(
            r["health"] != "unknown" for g in groups for r in g["rules"]
        )

    wait_until(evaluated, "central prometheus: every shipped rule evaluated", step=0.2)
    groups = stack.central.client.get("/api/v1/rules").json()["data"]["groups"]
    bad = [f"{g['name']}/{r['name']}: {r.get('lastError')}" for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert not bad, bad


def test_shipped_rules_evaluate_in_vmalert_over_victoria_metrics(stack: Stack) -> None:
    expected = _rule_groups(stack.rule_files)
    # vmalert's Prometheus-compatible listing
    groups = stack.vmalert.get("/api/v1/rules").json()["data"]["groups"]
    assert {g["name"]: len(g["rules"]) for g in groups} == expected
    errors = [f"{g['name']}/{r['name']}: {r['lastError']}" for g in groups for r in g["rules"] if r.get("lastError")]
    assert not errors, errors


def _selection(store: Store, dashboard: dict[str, Any]) -> dict[str, str]:
    """All where a variable allows it, else its first value (a single node)."""
    values = variable_defaults(dashboard)
    for variable in query_variables(dashboard):
        if variable.get("includeAll"):
            values[variable["name"]] = all_value(variable)
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        selector, _, label = substitute(query, values).removeprefix("label_values(").rstrip(")").rpartition(",")
        values[variable["name"]] = store.label_values(selector.strip(), label.strip())[0]
    return values


def _series(data: dict[str, Any], keep_name: bool = True) -> dict[frozenset[tuple[str, str]], float]:
    if data["resultType"] == "scalar":
        return {frozenset(): float(data["result"][1])}
    return {
        frozenset((k, v) for k, v in s["metric"].items() if keep_name or k != "__name__"): float(s["value"][1])
        for s in data["result"]
    }


def _close(a: float, b: float, absolute: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= max(absolute, RELATIVE * max(abs(a), abs(b)))


@pytest.mark.parametrize("store_name", ["central", "victoria"])
def test_dashboard_queries_return_what_a_single_prometheus_returns(stack: Stack, store_name: str) -> None:
    store: Store = getattr(stack, store_name)
    # MetricsQL (VictoriaMetrics 1.79) keeps the metric name on some range functions
    # (avg_over_time ...) where PromQL drops it: the series are the same, the name only shows in a
    # default legend. And increase() over a range that holds a series' first sample counts that
    # sample from 0 where PromQL starts at it: here every series is younger than the dashboards'
    # increase ranges, so those values differ by design (on series older than the range they agree);
    # so do the series vmalert records from increase() (the `:increase5m` names).
    victoria = store is stack.victoria
    problems = []
    compared = 0
    for name, dashboard in sorted(DASHBOARDS.items()):
        values = _selection(stack.reference, dashboard)
        at = time.time() - QUERY_LAG
        for where, expr, _ in queries(dashboard):
            promql = substitute(expr, values)
            want = _series(stack.reference.query(promql, at), keep_name=not victoria)
            got = _series(store.query(promql, at), keep_name=not victoria)
            if set(want) != set(got):
                missing = [dict(k) for k in set(want) - set(got)][:3]
                extra = [dict(k) for k in set(got) - set(want)][:3]
                problems.append(f"{name} {where}: series differ; missing {missing}, extra {extra}\n    {promql}")
                continue
            # increase() itself, or a series recorded from it (`...:increase5m`, recorded by vmalert)
            if victoria and "increase" in promql:
                continue
            absolute = AGE_ABSOLUTE if "time" in promql else ABSOLUTE
            for key, value in want.items():
                compared += 1
                if not _close(value, got[key], absolute):
                    problems.append(
                        f"{name} {where} {dict(key)}: {value} here, {got[key]} at {store.name}\n    {promql}"
                    )
    assert not problems, f"{len(problems)} differences ({compared} values compared):\n" + "\n".join(problems)
    assert compared > 100
