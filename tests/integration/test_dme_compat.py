"""AMD device-metrics-exporter's dashboards, queried on a real Prometheus scraping the demo exporter with
deploy/prometheus/dme-compat.rules.yml loaded.

The facts used here are DME's, from its published metric list and its five Grafana dashboards
(gpu, job, node, overview, system): the metric names, their units, the labels the panels filter on
(hostname, gpu_id, gpu_uuid, gpu_partition_id, card_model, serial_number, cluster_name, job_id, pod)
and the template variables they chain with label_values: cluster_name, then hostname within a
cluster, then gpu_id within a host, then gpu_partition_id and gpu_uuid within a GPU, then card_model,
serial_number, vbios_version and driver_version of a gpu_uuid. The queries below have the shapes the
panels use (averages and sums by a label, topk, delta over counters, `< 1` on gpu_health), written
here, not copied.

The demo node: an MI210 (edge sensor) and an MI300X (junction, no edge), Slurm job 4242 on GPU 1
through the shipped prolog, the target labels node and cluster_name as the docs set them.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from exporter.exposition.dme_reference import DME_METRICS, RULES
from tests.realtools import free_port, require_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
RULE_TEST = REPO / "deploy" / "prometheus" / "tests" / "dme" / "dme-compat.yml"
PROLOG = REPO / "deploy" / "slurm" / "prolog.sh"
NODE = "gpu-node-7"
CLUSTER = "demo-cluster"
JOB = "4242"


@dataclass
class Node:
    prometheus: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()["data"]["result"]
        return result

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = {"match[]": match} if match else {}
        response = httpx.get(f"{self.prometheus}/api/v1/label/{label}/values", params=params, timeout=10)
        response.raise_for_status()
        values: list[str] = response.json()["data"]
        return values


def _running(processes: dict[Path, subprocess.Popen[bytes]]) -> None:
    for log, process in processes.items():
        assert process.poll() is None, log.read_text(errors="replace")


def _wait_for(node: Node, expr: str, processes: dict[Path, subprocess.Popen[bytes]]) -> None:
    """Until `expr` has a result; the module's pytest timeout bounds the wait, a dead process ends it."""
    while not node.query(expr):
        _running(processes)
        time.sleep(0.2)


def _ready(url: str, processes: dict[Path, subprocess.Popen[bytes]]) -> None:
    while True:
        _running(processes)
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    prometheus = require_tool("prometheus")
    exporter = require_tool("amdgpu-exporter")
    work = tmp_path_factory.mktemp("dme")
    state = work / "slurm"
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_PARTITION": "mi300",
        "SLURM_JOB_GPUS": "1",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        "AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state),
    }
    subprocess.run(["bash", str(PROLOG)], env=env, check=True, capture_output=True, timeout=30)
    exporter_address = f"127.0.0.1:{free_port()}"
    prometheus_url = f"http://127.0.0.1:{free_port()}"
    # The shipped groups run once a minute; here every second, so the test waits seconds, not minutes.
    rules = work / RULES.name
    rules.write_text(re.sub(r"interval: \d+m", "interval: 1s", RULES.read_text(encoding="utf-8")), encoding="utf-8")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "amdgpu-exporter",
                # The target labels the docs set: node (README, "With Prometheus") and cluster_name
                # (docs/migrating-from-dme.md).
                "static_configs": [{"targets": [exporter_address], "labels": {"node": NODE, "cluster_name": CLUSTER}}],
            }
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    logs = {name: work / f"{name}.log" for name in ("exporter", "prometheus")}
    processes: dict[Path, subprocess.Popen[bytes]] = {}
    try:
        with logs["exporter"].open("wb") as log:
            exporter_process = subprocess.Popen(
                [
                    exporter,
                    "--demo",
                    "--demo.fleet=MI210,MI300X",
                    "--demo.scenario=training",
                    "--interval=1s",
                    # gpu_min_clock's source, off by default (docs/migrating-from-dme.md)
                    "--families.include=amdgpu_clock_min_hertz",
                    # No --attribution.series-labels: the rules join job_id from amdgpu_job_info.
                    f"--slurm.state-dir={state}",
                    f"--web.listen-address={exporter_address}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        processes[logs["exporter"]] = exporter_process
        with logs["prometheus"].open("wb") as log:
            prometheus_process = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'data'}",
                    f"--web.listen-address={prometheus_url.removeprefix('http://')}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        processes[logs["prometheus"]] = prometheus_process
        _ready(f"http://{exporter_address}/readyz", processes)
        _ready(f"{prometheus_url}/-/ready", processes)
        found = Node(prometheus_url)
        # delta() over a counter needs two samples: wait until the last rule has recorded three.
        _wait_for(found, "count_over_time(gpu_ecc_uncorrect_total[1m]) > 2", processes)
        yield found
    finally:
        for process in reversed(list(processes.values())):
            process.terminate()
            process.wait(timeout=30)


def test_the_rules_pass_promtool_check_and_their_unit_tests() -> None:
    promtool = require_tool("promtool")
    checked = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", RULE_TEST.name], cwd=RULE_TEST.parent, capture_output=True, text=True, timeout=60
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_dme_metric_this_exporter_can_source_has_data(node: Node) -> None:
    empty = []
    for metric in DME_METRICS:
        if metric.source is None:
            continue
        if not node.query(f'{metric.name}{{hostname="{NODE}", cluster_name="{CLUSTER}"}}'):
            empty.append(metric.name)
    assert not empty


def test_the_template_variable_chains_resolve(node: Node) -> None:
    assert CLUSTER in node.label_values("cluster_name")
    assert node.label_values("hostname", f'{{cluster_name="{CLUSTER}"}}') == [NODE]
    assert node.label_values("gpu_id", f'{{hostname="{NODE}"}}') == ["0", "1"]
    assert node.label_values("gpu_partition_id", f'{{hostname="{NODE}", gpu_id="1"}}') == ["0"]
    (uuid,) = node.label_values(
        "gpu_uuid", f'{{cluster_name="{CLUSTER}", hostname="{NODE}", gpu_id="1", gpu_partition_id="0"}}'
    )
    for label in ("card_model", "card_series", "serial_number", "vbios_version", "driver_version"):
        (value,) = node.label_values(label, f'{{gpu_uuid="{uuid}"}}')
        assert value, label
    # DME's card_model, the FRU part number its dashboards match MI300-class boards by; the name beside it.
    assert node.label_values("card_model", f'{{gpu_uuid="{uuid}"}}') == ["102-G30211-00"]
    assert node.label_values("card_series", f'{{gpu_uuid="{uuid}"}}') == ["AMD Instinct MI300X"]
    assert JOB in node.label_values("job_id", f'{{cluster_name="{CLUSTER}"}}')


def test_the_dashboards_query_shapes_return_data_in_dmes_units(node: Node) -> None:
    host = f'hostname=~"{NODE}"'
    by_gpu = {
        row["metric"]["gpu_id"]: float(row["value"][1])
        for row in node.query(f"avg(gpu_gfx_busy_instantaneous{{{host}}}) by (gpu_id)")
    }
    assert set(by_gpu) == {"0", "1"} and all(0 <= v <= 100 for v in by_gpu.values())
    # Percent, not a ratio: the training scenario keeps the GPUs busy.
    assert max(by_gpu.values()) > 1
    power = node.query(f"sum(gpu_package_power{{{host}}}) or vector(0)")
    assert float(power[0]["value"][1]) > 10
    # MB: a demo GPU has tens of GB of VRAM, so its total is in the tens of thousands.
    total_vram = float(node.query(f'sum(gpu_total_vram{{cluster_name="{CLUSTER}"}})')[0]["value"][1])
    assert 10_000 < total_vram < 1_000_000
    used = node.query(f'topk(5, gpu_used_vram{{cluster_name="{CLUSTER}"}})')
    assert len(used) == 2
    # GT/s and Mb/s.
    assert {float(r["value"][1]) for r in node.query(f"pcie_max_speed{{{host}}}")} <= {16.0, 32.0}
    assert node.query(f'sum(pcie_bandwidth{{cluster_name="{CLUSTER}"}})')
    # Counters as the PCIe and ECC panels read them.
    for name in ("pcie_replay_count", "pcie_recovery_count", "pcie_nack_sent_count", "pcie_nack_received_count"):
        assert node.query(f'sum(delta({name}{{{host}, gpu_partition_id=~"0"}}[30s]))'), name
    for name in ("gpu_ecc_correct_total", "gpu_ecc_uncorrect_total"):
        assert node.query(f'sum(delta({name}{{cluster_name="{CLUSTER}"}}[30s]))'), name
    assert node.query(f"sum(delta(gpu_energy_consumed{{{host}}}[30s])) > 0")
    # Temperatures: the MI210's edge, the MI300X's junction.
    assert [r["metric"]["card_series"] for r in node.query(f"gpu_edge_temperature{{{host}}}")] == ["AMD Instinct MI210"]
    assert node.query('avg(gpu_junction_temperature{card_model=~"102-G30211-00|102-G30211-0C"})')
    assert node.query(f"avg(gpu_memory_temperature{{{host}}})")
    # Health: both devices up, none counted as unhealthy; the node's GPU count.
    assert node.query(f"count(gpu_health{{{host}}} < 1)") == []
    assert float(node.query(f'gpu_nodes_total{{hostname="{NODE}"}}')[0]["value"][1]) == 2


def test_the_job_dashboard_finds_the_slurm_job(node: Node) -> None:
    rows = node.query(f'sum(group by (gpu_uuid) (gpu_gfx_busy_instantaneous{{job_id!="", job_id="{JOB}"}}))')
    assert float(rows[0]["value"][1]) == 1
    nodes = node.query(f'sum(group by (hostname) (gpu_gfx_busy_instantaneous{{job_id="{JOB}"}}))')
    assert float(nodes[0]["value"][1]) == 1
    assert node.query(f'sum(gpu_used_vram{{job_id!="", job_id="{JOB}"}})')
    assert node.query(f'gpu_health{{job_id!="", job_id="{JOB}"}} or vector(0)')


def test_the_ecc_panel_regex_selects_only_the_two_totals(node: Node) -> None:
    names = {r["metric"]["__name__"] for r in node.query(f'{{__name__=~".*ecc.*", hostname="{NODE}"}}')}
    assert names == {"gpu_ecc_correct_total", "gpu_ecc_uncorrect_total"}


def test_rules_cost_per_gpu(node: Node) -> None:
    """The series the rules add, per GPU of this node (the figure docs/migrating-from-dme.md states)."""
    per_gpu = [m.name for m in DME_METRICS if m.source is not None and m.per_gpu]
    names = "|".join(["gpu:amdgpu_device_info:dme_labels", *per_gpu])
    added = {
        row["metric"]["card_series"]: int(row["value"][1])
        for row in node.query(f'count by (card_series) ({{__name__=~"{names}", hostname="{NODE}"}})')
    }
    node_level = len(node.query(f'gpu_nodes_total{{hostname="{NODE}"}}'))
    print(f"dme-compat: series added per GPU {added}, per node {node_level}")
    assert node_level == 1
    # At most one series per rule and GPU, but four for the HBM stacks and eight for an MI300X's XCCs.
    assert set(added) == {"AMD Instinct MI210", "AMD Instinct MI300X"}
    assert all(count <= len(per_gpu) + 1 + 3 + 7 for count in added.values())
