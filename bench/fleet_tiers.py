"""Two tiers, measured: shards of real Prometheus servers scraping N virtual nodes and remote-writing
to a central Prometheus and to VictoriaMetrics, with the files of deploy/prometheus/fleet.

    python -m bench.fleet_tiers --layout agent|rules --nodes 1000 --shards 2 [--split blocks|kind]
                                [--fleets 'MIXED'] [--warmup 420] [--dashboards amdgpu-fleet]
                                [--repeats 2] [--json FILE]
    python -m bench.fleet_tiers report FILE.json...      (the tables again, from saved runs)

The nodes are bench.fleet's virtual nodes (`python -m bench.fleet serve`: captured demo bodies,
values moving every scrape). The shipped files are rendered with the bench's targets and URLs and
nothing else changed (bench.fleet_tiers.render_*):

- `--layout agent`: K agent shards (shard-agent.yml, `--enable-feature=agent`) remote-write every
  sample to the central Prometheus (central.yml, `--web.enable-remote-write-receiver`, the shipped
  rules) and to VictoriaMetrics (the file's second remote_write), where vmalert evaluates the
  shipped rules with the flags docs/fleet.md gives.
- `--layout rules`: K full shards (shard-rules.yml: the shipped rules, external label `shard`)
  remote-write everything to a central Prometheus that evaluates nothing (central.yml without
  rule_files, as docs/fleet.md says) and to VictoriaMetrics (shard-agent.yml's second
  remote_write appended; the Alertmanager section dropped: there is none here).

Nodes are split by blocks (node i to shard i*K//N: every shard the same mix) or by kind (one demo
fleet a shard: a shard's RSS per node is then one ASIC's). While the warm-up runs, every process's
/metrics is read each scrape interval: rule groups' last duration, missed iterations, and the
shards' remote-write queues (pending, failed, retried and dropped samples, lag = newest sample
appended minus newest sample sent). At the end: each process's CPU (cores, over the time after all
targets were up) and RSS, head series, then every query of the chosen dashboards as bench.fleet
runs it (the range, the step, variables from the centre) on the central Prometheus and on
VictoriaMetrics while ingestion goes on, wall time best of --repeats, and whether the two answer
the same: each query's expression evaluated once as an instant query at the same time on both,
series compared without their names (MetricsQL keeps the name where PromQL drops it), values
within 10 % (or 0.02).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import fleet
from bench import report as fmt
from bench.procstat import cpu_seconds, rss_bytes

FLEET_FILES = fleet.ROOT / "deploy" / "prometheus" / "fleet"
LAG = 10.0  # seconds: queries end this far back, past the agents' 5 s batch deadline
RELATIVE = 0.10  # how far two stores' values may differ (a scrape's jitter is 2 %)
ABSOLUTE = 0.02
AGE_ABSOLUTE = 30.0  # queries over sample age (time() - x) differ by up to a scrape or a batch


# ---------------------------------------------------------------------------------------------
# Pure pieces: splitting the nodes, rendering the shipped files, reading /metrics, comparing
# ---------------------------------------------------------------------------------------------


def node_kind(i: int, fleets: Sequence[str]) -> str:
    """The demo fleet node i replays (bench.fleet serve: captures[i % len])."""
    return fleets[i % len(fleets)]


def split_nodes(nodes: int, shards: int, fleets: Sequence[str], by_kind: bool = False) -> list[list[int]]:
    """Node indexes per shard: contiguous blocks, or one demo fleet (kind) a shard."""
    if shards < 1 or nodes < shards:
        raise ValueError(f"{nodes} nodes over {shards} shards: need 1 <= shards <= nodes")
    if by_kind:
        kinds = list(dict.fromkeys(fleets))
        if len(kinds) != shards:
            raise ValueError(f"--split kind needs one shard per kind: {len(kinds)} kinds ({', '.join(kinds)})")
        return [[i for i in range(nodes) if node_kind(i, fleets) == kind] for kind in kinds]
    return [[i for i in range(nodes) if i * shards // nodes == k] for k in range(shards)]


def node_targets(indexes: Sequence[int], server_port: int) -> list[dict[str, Any]]:
    """Static configs for bench.fleet's virtual nodes (the labels bench.fleet gives them)."""
    return [
        {
            "targets": [f"127.0.0.1:{server_port}"],
            "labels": {
                "instance": f"node-{i:05d}:9442",
                "node": f"node-{i:05d}",
                "__metrics_path__": f"/node/{i}/metrics",
            },
        }
        for i in indexes
    ]


def render_agent(
    shipped: dict[str, Any], targets: list[dict[str, Any]], central_url: str, victoria_url: str
) -> dict[str, Any]:
    """shard-agent.yml with the bench's targets and the two remote_write URLs; nothing else changed."""
    config = copy.deepcopy(shipped)
    config["scrape_configs"][0]["static_configs"] = targets
    central, victoria = config["remote_write"]
    central["url"] = f"{central_url}/api/v1/write"
    victoria["url"] = f"{victoria_url}/api/v1/write"
    return config


def render_rules_shard(
    shipped: dict[str, Any],
    agent: dict[str, Any],
    targets: list[dict[str, Any]],
    shard: str,
    rule_files: Sequence[str],
    central_url: str,
    victoria_url: str,
) -> dict[str, Any]:
    """shard-rules.yml with the bench's targets, its shard label, the rule files' real paths, the
    centre's URL, shard-agent.yml's VictoriaMetrics remote_write appended, and no Alertmanager."""
    config = copy.deepcopy(shipped)
    config["global"]["external_labels"]["shard"] = shard
    config["rule_files"] = list(rule_files)
    config["scrape_configs"][0]["static_configs"] = targets
    config["remote_write"][0]["url"] = f"{central_url}/api/v1/write"
    victoria = copy.deepcopy(agent["remote_write"][1])
    victoria["url"] = f"{victoria_url}/api/v1/write"
    config["remote_write"].append(victoria)
    config.pop("alerting", None)
    return config


def render_central(shipped: dict[str, Any], rule_files: Sequence[str]) -> dict[str, Any]:
    """central.yml with the rule files' real paths (none: the centre behind shards with rules)."""
    config = copy.deepcopy(shipped)
    config["rule_files"] = list(rule_files)
    return config


def shipped_rule_files(config_path: Path) -> list[str]:
    """A shipped file's rule_files, resolved from its directory."""
    loaded = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    return [str((config_path.parent / name).resolve()) for name in loaded.get("rule_files", [])]


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric name in a /metrics body: (labels, value)."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            found.append((labels, float(match.group(3))))
    return found


def samples_by_label(text: str, fields: dict[str, str], label: str) -> dict[str, dict[str, float]]:
    """{value of `label`: {key: value}} for each metric of `fields` ({metric: key}) in an exposition."""
    rows: dict[str, dict[str, float]] = {}
    for metric, key in fields.items():
        for labels, value in metric_samples(text, metric):
            rows.setdefault(labels.get(label, "?"), {})[key] = value
    return rows


def rule_groups(text: str) -> dict[str, dict[str, float]]:
    """Per rule group (its name, without the file): last duration, interval, iterations, missed."""
    fields = {
        "prometheus_rule_group_last_duration_seconds": "last",
        "prometheus_rule_group_interval_seconds": "interval",
        "prometheus_rule_group_iterations_total": "iterations",
        "prometheus_rule_group_iterations_missed_total": "missed",
    }
    groups: dict[str, dict[str, float]] = {}
    for name, row in samples_by_label(text, fields, "rule_group").items():  # "file;group"
        groups.setdefault(name.rsplit(";", 1)[-1], {}).update(row)
    return groups


def vmalert_groups(text: str) -> dict[str, dict[str, float]]:
    """Per vmalert group: evaluation time summed and counted so far, the highest of its recent
    evaluations (quantile 1), interval, iterations, missed."""
    fields = {
        "vmalert_iteration_duration_seconds_sum": "sum",
        "vmalert_iteration_duration_seconds_count": "count",
        "vmalert_iteration_interval_seconds": "interval",
        "vmalert_iteration_total": "iterations",
        "vmalert_iteration_missed_total": "missed",
    }
    groups = samples_by_label(text, fields, "group")
    for labels, value in metric_samples(text, "vmalert_iteration_duration_seconds"):
        if labels.get("quantile") == "1":
            groups.setdefault(labels.get("group", "?"), {})["last"] = value
    return groups


def remote_writes(text: str) -> dict[str, dict[str, float]]:
    """Per remote_write URL: samples pending, sent, failed, retried, dropped; shards; lag in seconds
    (the newest sample appended to the WAL minus the newest one sent)."""
    fields = {
        "prometheus_remote_storage_samples_pending": "pending",
        "prometheus_remote_storage_samples_total": "sent",
        "prometheus_remote_storage_samples_failed_total": "failed",
        "prometheus_remote_storage_samples_retried_total": "retried",
        "prometheus_remote_storage_samples_dropped_total": "dropped",
        "prometheus_remote_storage_shards": "shards",
        "prometheus_remote_storage_queue_highest_sent_timestamp_seconds": "highest_sent",
    }
    queues = samples_by_label(text, fields, "url")
    newest = metric_samples(text, "prometheus_remote_storage_highest_timestamp_in_seconds")
    if newest:
        for queue in queues.values():
            if "highest_sent" in queue:
                queue["lag"] = max(0.0, newest[0][1] - queue["highest_sent"])
    return queues


def _series(data: dict[str, Any]) -> dict[frozenset[tuple[str, str]], float]:
    if data["resultType"] == "scalar":
        return {frozenset(): float(data["result"][1])}
    return {
        frozenset((k, v) for k, v in s["metric"].items() if k != "__name__"): float(s["value"][1])
        for s in data["result"]
    }


def compare(first: dict[str, Any], second: dict[str, Any], absolute: float = ABSOLUTE) -> str:
    """'' when two instant results hold the same series (names aside) with values within
    RELATIVE (or `absolute`), else what differs."""
    a, b = _series(first), _series(second)
    if set(a) != set(b):
        return f"series differ: {len(a)} and {len(b)}, {len(set(a) ^ set(b))} not in both"
    far = 0
    for key, value in a.items():
        other = b[key]
        if math.isnan(value) or math.isnan(other):
            far += not (math.isnan(value) and math.isnan(other))
        elif abs(value - other) > max(absolute, RELATIVE * max(abs(value), abs(other))):
            far += 1
    return f"{far} of {len(a)} values differ" if far else ""


# ---------------------------------------------------------------------------------------------
# A run
# ---------------------------------------------------------------------------------------------


class Processes:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=fleet.ROOT
            )
        self.started[name] = process
        return process

    def stop_all(self) -> None:
        for process in reversed(list(self.started.values())):
            fleet._stop(process)


def _yaml(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _write(path: Path, config: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return str(path)


def _get(url: str) -> str:
    try:
        return httpx.get(url, timeout=20).text
    except httpx.HTTPError:
        return ""


def _query(client: httpx.Client, expr: str, at: float) -> dict[str, Any]:
    try:
        response = client.post("/api/v1/query", data={"query": expr, "time": f"{at:.3f}"})
        body = response.json()
    except (httpx.HTTPError, ValueError) as error:  # VictoriaMetrics answers some errors in plain text
        raise RuntimeError(f"{type(error).__name__}: {error}"[:200]) from None
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}"[:200])
    return dict(body["data"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    prometheus = shutil.which("prometheus") or "prometheus"
    victoria_metrics = shutil.which("victoria-metrics") or "victoria-metrics"
    fleets = [f for f in args.fleets.split(";") if f]
    parts = split_nodes(args.nodes, args.shards, fleets, args.split == "kind")
    agent_file = _yaml(FLEET_FILES / "shard-agent.yml")
    central_rules = shipped_rule_files(FLEET_FILES / "central.yml")
    shard_rules = shipped_rule_files(FLEET_FILES / "shard-rules.yml")
    result: dict[str, Any] = {
        "layout": args.layout,
        "nodes": args.nodes,
        "shards": args.shards,
        "split": args.split,
        "fleets": fleets,
        "command": "python -m bench.fleet_tiers " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "load_start": fmt.load_average(),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "rule_files": [Path(p).name for p in (central_rules if args.layout == "agent" else shard_rules)],
        "shard_nodes": [{"nodes": len(p), "kinds": sorted({node_kind(i, fleets) for i in p})} for p in parts],
    }
    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as tmp:
        work = Path(tmp)
        procs = Processes(work)
        try:
            captures = [fleet.capture(f, work) for f in dict.fromkeys(fleets)]
            by_fleet = {c["fleet"]: c for c in captures}
            (work / "captures.json").write_text(json.dumps([by_fleet[f] for f in fleets]), encoding="utf-8")
            result["captures"] = {
                c["fleet"]: sum(1 for line in c["second"].splitlines() if line and not line.startswith("#"))
                for c in captures
            }
            server_port = fleet._free_port()
            procs.start(
                "server",
                [
                    sys.executable,
                    "-m",
                    "bench.fleet",
                    "serve",
                    str(work / "captures.json"),
                    str(args.nodes),
                    str(server_port),
                ],
            )
            vm_port, central_port = fleet._free_port(), fleet._free_port()
            victoria_url, central_url = f"http://127.0.0.1:{vm_port}", f"http://127.0.0.1:{central_port}"
            procs.start(
                "victoria-metrics",
                [
                    victoria_metrics,
                    f"-storageDataPath={work / 'vm-data'}",
                    f"-httpListenAddr=127.0.0.1:{vm_port}",
                    "-search.latencyOffset=1s",  # as the integration test: the default hides the last 30 s
                    "-search.disableCache",  # every repeat of a query does the work
                    "-search.maxUniqueTimeseries=10000000",  # the default 300k refuses fleet-wide raw selectors
                ],
            )
            central = render_central(
                _yaml(FLEET_FILES / "central.yml"), central_rules if args.layout == "agent" else []
            )
            procs.start(
                "central",
                [
                    prometheus,
                    f"--config.file={_write(work / 'central.yml', central)}",
                    "--web.enable-remote-write-receiver",
                    f"--storage.tsdb.path={work / 'central-data'}",
                    f"--web.listen-address=127.0.0.1:{central_port}",
                    "--log.level=warn",
                ],
            )
            shard_urls = []
            for k, part in enumerate(parts):
                port = fleet._free_port()
                shard_urls.append(f"http://127.0.0.1:{port}")
                targets = node_targets(part, server_port)
                if args.layout == "agent":
                    config = render_agent(agent_file, targets, central_url, victoria_url)
                    mode = ["--enable-feature=agent", f"--storage.agent.path={work / f'shard-{k}'}"]
                else:
                    config = render_rules_shard(
                        _yaml(FLEET_FILES / "shard-rules.yml"),
                        agent_file,
                        targets,
                        f"shard-{k + 1}",
                        shard_rules,
                        central_url,
                        victoria_url,
                    )
                    mode = [f"--storage.tsdb.path={work / f'shard-{k}'}", "--storage.tsdb.retention.time=2d"]
                procs.start(
                    f"shard-{k + 1}",
                    [
                        prometheus,
                        f"--config.file={_write(work / f'shard-{k + 1}.yml', config)}",
                        *mode,
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                )
            vmalert_url = ""
            if args.layout == "agent":
                # agent shards -> VictoriaMetrics + vmalert (docs/fleet.md): the recorded series the
                # dashboards read come from vmalert; the flags are the ones docs/fleet.md gives
                vmalert_port = fleet._free_port()
                vmalert_url = f"http://127.0.0.1:{vmalert_port}"
                procs.start(
                    "vmalert",
                    [
                        shutil.which("vmalert") or "vmalert",
                        *(f"-rule={p}" for p in central_rules),
                        f"-datasource.url={victoria_url}",
                        f"-remoteWrite.url={victoria_url}",
                        f"-remoteRead.url={victoria_url}",
                        f"-notifier.url=http://127.0.0.1:{fleet._free_port()}",  # no Alertmanager here
                        f"-evaluationInterval={fleet.SCRAPE_INTERVAL}s",
                        f"-httpListenAddr=127.0.0.1:{vmalert_port}",
                    ],
                )
            result |= measure(args, procs, central_url, victoria_url, shard_urls, vmalert_url)
        finally:
            procs.stop_all()
    result["load_end"] = fmt.load_average()
    return result


def measure(
    args: argparse.Namespace,
    procs: Processes,
    central_url: str,
    victoria_url: str,
    shard_urls: list[str],
    vmalert_url: str,
) -> dict[str, Any]:
    started = time.time()
    central = httpx.Client(base_url=central_url, timeout=300)
    victoria = httpx.Client(base_url=victoria_url, timeout=300)
    fleet._wait(lambda: central.get("/-/ready").status_code == 200, 60, "central /-/ready")

    def all_up() -> bool:
        up = _query(central, f'count(up{{job="{fleet.JOB}"}} == 1)', time.time())["result"]
        return bool(up) and int(float(up[0]["value"][1])) >= 0.99 * args.nodes

    up_after: float | None = None
    try:
        fleet._wait(all_up, 3 * fleet.SCRAPE_INTERVAL + 60 + 0.3 * args.nodes, f"{args.nodes} nodes up at the centre")
        up_after = time.time() - started
    except TimeoutError as error:  # the centre does not keep up: measured all the same, and said
        print(f"  {error}; measuring anyway", flush=True)
    pids = {name: p.pid for name, p in procs.started.items()}
    cpu_from = {name: cpu_seconds(pid) for name, pid in pids.items()}
    cpu_at = time.time()
    rss_max = dict.fromkeys(pids, 0)
    rule_samples: dict[str, list[dict[str, dict[str, float]]]] = {}
    queue_samples: dict[str, list[dict[str, dict[str, float]]]] = {}
    missed_from: dict[str, dict[str, float]] = {}
    loads = [fmt.load_average()]
    rule_sources = (
        {"central": central_url, "vmalert": vmalert_url}
        if args.layout == "agent"
        else dict(zip(_shard_names(shard_urls), shard_urls, strict=True))
    )
    while time.time() - started < args.warmup:
        time.sleep(fleet.SCRAPE_INTERVAL)
        for name, pid in pids.items():
            rss_max[name] = max(rss_max[name], rss_bytes(pid))
        for name, url in rule_sources.items():
            body = _get(f"{url}/metrics")
            state = vmalert_groups(body) if name == "vmalert" else rule_groups(body)
            missed_from.setdefault(name, {g: v.get("missed", 0.0) for g, v in state.items()})
            rule_samples.setdefault(name, []).append(state)
        for name, url in zip(_shard_names(shard_urls), shard_urls, strict=True):
            queue_samples.setdefault(name, []).append(remote_writes(_get(f"{url}/metrics")))
        loads.append(fmt.load_average())
        print(f"  {time.time() - started:.0f}/{args.warmup:.0f} s, load {loads[-1]}", flush=True)
    elapsed = time.time() - cpu_at
    processes = {
        name: {
            "cpu_cores": (cpu_seconds(pid) - cpu_from[name]) / elapsed,
            "rss": rss_bytes(pid),
            "rss_max": rss_max[name],
        }
        for name, pid in pids.items()
    }
    heads = {"central": _head_series(central)}
    if args.layout == "rules":
        for name, url in zip(_shard_names(shard_urls), shard_urls, strict=True):
            with httpx.Client(base_url=url, timeout=60) as client:
                heads[name] = _head_series(client)
    heads["victoria-metrics"] = _victoria_series(victoria)
    up = {}
    for store, client in (("central", central), ("victoria-metrics", victoria)):
        try:
            found = _query(client, f'count(up{{job="{fleet.JOB}"}} == 1)', time.time() - LAG)["result"]
            up[store] = int(float(found[0]["value"][1])) if found else 0
        except (RuntimeError, httpx.HTTPError):
            up[store] = 0
    groups = summarise_groups(rule_samples, missed_from)
    queues = summarise_queues(
        queue_samples,
        {f"{central_url}/api/v1/write": "central", f"{victoria_url}/api/v1/write": "victoria-metrics"},
    )
    if args.json:  # kept should the queries fail
        measured = {"processes": processes, "head_series": heads, "groups": groups, "remote_write": queues}
        Path(args.json + ".partial").write_text(json.dumps(measured, indent=1), encoding="utf-8")
    try:
        queries = dashboard_answers(args, central, victoria, pids)
    except (httpx.HTTPError, ValueError, RuntimeError) as error:
        print(f"  dashboard queries failed: {error}", flush=True)
        queries = []
    loads.append(fmt.load_average())
    central.close()
    victoria.close()
    return {
        "up_after": up_after,
        "nodes_up": up,
        "measured_seconds": elapsed,
        "processes": processes,
        "head_series": heads,
        "groups": groups,
        "remote_write": queues,
        "queries": queries,
        "loads": loads,
    }


def _shard_names(urls: Sequence[str]) -> list[str]:
    return [f"shard-{k + 1}" for k in range(len(urls))]


def _head_series(client: httpx.Client) -> int:
    try:
        return int(client.get("/api/v1/status/tsdb").json()["data"]["headStats"]["numSeries"])
    except (httpx.HTTPError, KeyError, ValueError):
        return 0


def _victoria_series(client: httpx.Client) -> int:
    try:
        return int(client.get("/api/v1/series/count").json()["data"][0])
    except (httpx.HTTPError, KeyError, ValueError, IndexError):
        return 0


def summarise_groups(
    samples: dict[str, list[dict[str, dict[str, float]]]], missed_from: dict[str, dict[str, float]]
) -> dict[str, dict[str, dict[str, float]]]:
    """Per evaluating process and group: mean and max last duration over the samples taken after
    the group's first evaluation, missed iterations during the measurement, interval."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for source, series in samples.items():
        names = {g for s in series for g in s}
        for group in sorted(names):
            durations = [
                s[group]["last"] for s in series if "last" in s.get(group, {}) and s[group].get("iterations", 0) > 0
            ]
            last = series[-1].get(group, {})
            mean = sum(durations) / len(durations) if durations else 0.0
            if "count" in last:  # vmalert: the mean over the evaluations during the measurement
                first = next(s[group] for s in series if group in s)
                done = last["count"] - first.get("count", 0.0)
                mean = (last["sum"] - first.get("sum", 0.0)) / done if done else last["sum"] / max(last["count"], 1)
            out.setdefault(source, {})[group] = {
                "mean": mean,
                "max": max(durations, default=0.0),
                "interval": last.get("interval", 0.0),
                "iterations": last.get("iterations", 0.0),
                "missed": last.get("missed", 0.0) - missed_from.get(source, {}).get(group, 0.0),
                "missed_total": last.get("missed", 0.0),
            }
    return out


def summarise_queues(
    samples: dict[str, list[dict[str, dict[str, float]]]], names: dict[str, str]
) -> dict[str, dict[str, dict[str, float]]]:
    """Per shard and remote_write (named by `names`: URL -> name): the last counters, the highest
    pending samples and queue shards, the mean and highest lag over the samples taken."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for shard, series in samples.items():
        for url in sorted({u for s in series for u in s}):
            points = [s[url] for s in series if url in s]
            last = points[-1]
            out.setdefault(shard, {})[names.get(url, url)] = {
                "sent": last.get("sent", 0.0),
                "failed": last.get("failed", 0.0),
                "retried": last.get("retried", 0.0),
                "dropped": last.get("dropped", 0.0),
                "pending_max": max(p.get("pending", 0.0) for p in points),
                "shards_max": max(p.get("shards", 0.0) for p in points),
                "lag_mean": sum(p.get("lag", 0.0) for p in points) / len(points),
                "lag_max": max(p.get("lag", 0.0) for p in points),
            }
    return out


def _time_query(
    client: httpx.Client, query: fleet.Query, values: dict[str, str], now: float, repeats: int, pid: int
) -> dict[str, Any]:
    try:
        return fleet.time_query(client, query, values, now, repeats, pid)
    except (httpx.HTTPError, ValueError) as error:  # an answer that is not JSON, a timeout
        failed = {"seconds": math.nan, "cpu": math.nan, "series": 0, "samples": 0, "promql": ""}
        return failed | {"error": f"{type(error).__name__}: {error}"[:200]}


def dashboard_answers(
    args: argparse.Namespace, central: httpx.Client, victoria: httpx.Client, pids: dict[str, int]
) -> list[dict[str, Any]]:
    """Every query of the chosen dashboards, as bench.fleet runs it, on both central stores; and
    whether the two answer the same at one instant."""
    directory = Path(args.dashboards_dir)
    wanted = set(args.dashboards.split(","))
    values = fleet.dashboard_values(directory, central)
    now = time.time() - LAG
    answers = []
    for query in fleet.dashboard_queries(directory):
        if query.dashboard not in wanted:
            continue
        timed = {
            store: _time_query(client, query, values[query.dashboard], now, args.repeats, pids[store])
            for store, client in (("central", central), ("victoria-metrics", victoria))
        }
        promql = timed["central"]["promql"] or timed["victoria-metrics"]["promql"]
        try:
            difference = compare(
                _query(central, promql, now),
                _query(victoria, promql, now),
                AGE_ABSOLUTE if "time" in promql else ABSOLUTE,
            )
        except RuntimeError as error:
            difference = f"error: {error}"
        answers.append(
            {
                "dashboard": query.dashboard,
                "where": query.where,
                "instant": query.instant,
                "promql": promql,
                **{
                    store: {k: t[k] for k in ("seconds", "cpu", "series", "samples", "error")}
                    for store, t in timed.items()
                },
                "difference": difference,
            }
        )
    return answers


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def build_report(result: dict[str, Any]) -> str:
    n, layout = result["nodes"], result["layout"]
    loads = [float(x.split(",")[0]) for x in result["loads"]]
    title = {
        "agent": "agent shards -> central Prometheus with the rules, + VictoriaMetrics",
        "rules": "shards with the rules -> central Prometheus (no rules), + VictoriaMetrics",
    }[layout]
    out = [
        f"### {n} nodes, {result['shards']} {title}",
        "",
        f"`{result['command']}`; {result['when']} UTC; load average (1, 5, 15 min) at start "
        f"{result['load_start']}, at end {result['load_end']}, 1-minute load during "
        f"{min(loads):.1f}-{max(loads):.1f}. Rule files: {', '.join(result['rule_files'])}. "
        f"Nodes ({result['split']} split): "
        + "; ".join(
            f"shard-{k + 1} {s['nodes']} ({', '.join(s['kinds'])})" for k, s in enumerate(result["shard_nodes"])
        )
        + (
            f". All targets up at the centre after {result['up_after']:.0f} s"
            if result["up_after"] is not None
            else ". NOT all targets up at the centre within the wait"
        )
        + f"; CPU over the {result['measured_seconds']:.0f} s after that. Nodes up "
        f"{LAG:.0f} s before the queries: "
        + ", ".join(f"{store} {count}" for store, count in result.get("nodes_up", {}).items())
        + ".",
        "",
    ]
    rows = []
    heads = result["head_series"]
    for name, proc in result["processes"].items():
        nodes = n
        if name.startswith("shard-"):
            nodes = result["shard_nodes"][int(name.split("-")[1]) - 1]["nodes"]
        head = heads.get(name)
        rows.append(
            [
                name,
                str(nodes) if name != "server" else f"{n} (virtual)",
                f"{proc['cpu_cores']:.2f}",
                f"{proc['cpu_cores'] / nodes * 1000:.2f}",
                _mib(proc["rss"]),
                _mib(proc["rss_max"]),
                f"{proc['rss_max'] / nodes / 2**20:.2f}" if name != "server" else "",
                fleet._count(head) if head else "",
                f"{head / nodes:.0f}" if head else "",
            ]
        )
    out += [
        fmt.markdown_table(
            [
                "process",
                "nodes",
                "CPU (cores)",
                "cores per 1,000 nodes",
                "RSS at end",
                "RSS max",
                "MiB a node (max)",
                "series",
                "a node",
            ],
            rows,
        ),
        "",
    ]
    rows = []
    for source, groups in result["groups"].items():
        for group, g in groups.items():
            share = g["mean"] / g["interval"] if g["interval"] else 0.0
            rows.append(
                [
                    source,
                    group,
                    f"{g['interval']:.0f} s",
                    fmt.seconds(g["mean"]),
                    fmt.seconds(g["max"]),
                    f"{share:.1%}",
                    f"{g['missed']:.0f}",
                    f"{g['iterations']:.0f}",
                ]
            )
    if rows:
        out += [
            "Rule groups (live, every scrape interval's prometheus_rule_group_last_duration_seconds):",
            "",
            fmt.markdown_table(
                ["evaluated at", "group", "interval", "mean", "max", "mean / interval", "missed", "iterations"], rows
            ),
            "",
        ]
    rows = []
    for shard, queues in result["remote_write"].items():
        for remote, q in queues.items():
            rows.append(
                [
                    shard,
                    remote,
                    fleet._count(q["sent"]),
                    f"{q['failed']:.0f}",
                    f"{q['retried']:.0f}",
                    f"{q['dropped']:.0f}",
                    fleet._count(q["pending_max"]),
                    f"{q['lag_mean']:.1f} / {q['lag_max']:.1f}",
                    f"{q['shards_max']:.0f}",
                ]
            )
    out += [
        "Remote write (prometheus_remote_storage_*; lag = highest_timestamp_in_seconds - "
        "queue_highest_sent_timestamp_seconds, read every 15 s):",
        "",
        fmt.markdown_table(
            [
                "shard",
                "to",
                "samples sent",
                "failed",
                "retried",
                "dropped",
                "pending (max)",
                "lag s (mean / max)",
                "queue shards (max)",
            ],
            rows,
        ),
        "",
    ]
    queries = result["queries"]
    if queries:
        same = [q for q in queries if not q["difference"]]
        increase = [q for q in queries if q["difference"] and "increase" in q["promql"]]
        rows = []
        for q in sorted(queries, key=lambda q: 0.0 if q["central"]["error"] else -q["central"]["seconds"]):
            cells = [f"{q['dashboard']}: {q['where']}".replace("|", "/")]
            for store in ("central", "victoria-metrics"):
                t = q[store]
                cells.append("error" if t["error"] else f"{fmt.seconds(t['seconds'])} / {fmt.seconds(t['cpu'])}")
            cells.append(q["difference"] or "same")
            rows.append(cells)
        stores = ("central", "victoria-metrics")
        totals = {s: sum(q[s]["seconds"] for q in queries if not q[s]["error"]) for s in stores}
        slowest = {s: _slowest(queries, s) for s in ("central", "victoria-metrics")}
        out += [
            f"Dashboard queries ({len(queries)}, as bench.fleet sends them, at the default range, during "
            f"ingestion), wall / the store's CPU, best of {result['repeats']}; slowest at the centre "
            f"{fmt.seconds(slowest['central']['central']['seconds'])} ({slowest['central']['where']}), on "
            f"VictoriaMetrics {fmt.seconds(slowest['victoria-metrics']['victoria-metrics']['seconds'])} "
            f"({slowest['victoria-metrics']['where']}); all queries {fmt.seconds(totals['central'])} and "
            f"{fmt.seconds(totals['victoria-metrics'])}. Same answer (each expression as an instant query "
            f"at one time on both, names aside, values within {RELATIVE:.0%}): {len(same)} of {len(queries)}"
            + (
                f"; {len(increase)} of the others use increase() (MetricsQL counts a series' first sample)"
                if increase
                else ""
            )
            + ".",
            "",
            fmt.markdown_table(["query", "central", "VictoriaMetrics", "answers"], rows),
            "",
        ]
    return "\n".join(out)


def _slowest(queries: list[dict[str, Any]], store: str) -> dict[str, Any]:
    return max(queries, key=lambda q: -1.0 if q[store]["error"] else float(q[store]["seconds"]))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_tiers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", choices=("agent", "rules"), default="agent")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--split", choices=("blocks", "kind"), default="blocks")
    parser.add_argument("--fleets", default=fleet.MIXED_FLEET, help="demo fleets the nodes take in turn")
    parser.add_argument("--warmup", type=float, default=420.0, help="seconds from the start to the queries")
    parser.add_argument("--dashboards", default="amdgpu-fleet", help="dashboards (file stems) to query, ','-separated")
    parser.add_argument("--dashboards-dir", default=str(fleet.DASHBOARD_DIR))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default="", help="write the raw figures here")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["report"]:
        for path in argv[1:]:
            print(build_report(json.loads(Path(path).read_text(encoding="utf-8"))))
        return 0
    args = parse_args(argv)
    for tool in ("prometheus", "victoria-metrics", "vmalert"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: ./.ci/install-debian-packages {tool}", file=sys.stderr)
            return 2
    if not fleet.EXPORTER.exists():
        print(f"{fleet.EXPORTER} is missing: make .venv/bin/.runtime-installed", file=sys.stderr)
        return 2
    try:
        split_nodes(args.nodes, args.shards, [f for f in args.fleets.split(";") if f], args.split == "kind")
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(build_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
