"""bench.fleet_tiers's pure pieces: splitting the virtual nodes over shards, rendering the shipped
deploy/prometheus/fleet files with the bench's targets (nothing else changed), reading rule groups
and remote-write queues from /metrics bodies, and comparing two stores' answers. The benchmark
itself (real Prometheus servers and VictoriaMetrics at 1,000 nodes) is not part of the tests."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.fleet_tiers import (
    FLEET_FILES,
    compare,
    metric_samples,
    node_targets,
    remote_writes,
    render_agent,
    render_central,
    render_rules_shard,
    rule_groups,
    shipped_rule_files,
    split_nodes,
    summarise_groups,
    summarise_queues,
    vmalert_groups,
)

FLEETS = ["8xMI300X", "4xMI250X", "8xMI300X", "8xMI300X:CPX"]


def _shipped(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((FLEET_FILES / name).read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_blocks_give_every_node_to_one_shard_and_every_shard_the_same_mix() -> None:
    parts = split_nodes(1000, 3, FLEETS)
    assert sorted(i for part in parts for i in part) == list(range(1000))
    assert [len(p) for p in parts] == [334, 333, 333]
    assert all(i < j for a, b in itertools.pairwise(parts) for i in a for j in b[:1])


def test_by_kind_gives_one_demo_fleet_a_shard() -> None:
    parts = split_nodes(8, 3, FLEETS, by_kind=True)
    assert parts == [[0, 2, 4, 6], [1, 5], [3, 7]]
    with pytest.raises(ValueError, match="one shard per kind"):
        split_nodes(8, 2, FLEETS, by_kind=True)


def test_more_shards_than_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="shards"):
        split_nodes(2, 3, FLEETS)


def test_targets_carry_the_labels_bench_fleet_gives_a_node() -> None:
    (target,) = node_targets([7], 9000)
    assert target == {
        "targets": ["127.0.0.1:9000"],
        "labels": {"instance": "node-00007:9442", "node": "node-00007", "__metrics_path__": "/node/7/metrics"},
    }


def test_an_agent_shard_is_the_shipped_file_with_targets_and_urls_only() -> None:
    shipped = _shipped("shard-agent.yml")
    targets = node_targets([0, 1], 9000)
    config = render_agent(shipped, targets, "http://c:1", "http://v:2")
    assert [w["url"] for w in config["remote_write"]] == ["http://c:1/api/v1/write", "http://v:2/api/v1/write"]
    assert config["scrape_configs"][0]["static_configs"] == targets
    # everything else as shipped: job name, relabelling, queue settings, intervals
    for key in ("job_name", "relabel_configs"):
        assert config["scrape_configs"][0][key] == shipped["scrape_configs"][0][key]
    assert config["remote_write"][0]["queue_config"] == shipped["remote_write"][0]["queue_config"]
    assert config["global"] == shipped["global"]
    assert "rule_files" not in config
    assert shipped["remote_write"][0]["url"].startswith("http://prometheus-central")  # the input is untouched


def test_a_shard_with_rules_keeps_its_rules_and_adds_the_long_term_store() -> None:
    shipped, agent = _shipped("shard-rules.yml"), _shipped("shard-agent.yml")
    config = render_rules_shard(
        shipped, agent, node_targets([3], 9000), "shard-2", ["/r/a.rules.yml"], "http://c:1", "http://v:2"
    )
    assert config["global"]["external_labels"] == {"shard": "shard-2"}
    assert config["global"]["evaluation_interval"] == shipped["global"]["evaluation_interval"]
    assert config["rule_files"] == ["/r/a.rules.yml"]
    assert [w["url"] for w in config["remote_write"]] == ["http://c:1/api/v1/write", "http://v:2/api/v1/write"]
    assert "alerting" not in config


def test_the_centre_loads_the_rules_or_none() -> None:
    shipped = _shipped("central.yml")
    assert render_central(shipped, ["/r/a.rules.yml"])["rule_files"] == ["/r/a.rules.yml"]
    assert render_central(shipped, [])["rule_files"] == []
    assert render_central(shipped, [])["global"] == shipped["global"]


def test_the_shipped_rule_files_resolve_from_the_config_directory() -> None:
    (path,) = shipped_rule_files(FLEET_FILES / "central.yml")
    assert Path(path) == (FLEET_FILES.parent / "amdgpu-exporter.rules.yml").resolve()


PROMETHEUS_METRICS = """\
# HELP prometheus_rule_group_last_duration_seconds x
prometheus_rule_group_last_duration_seconds{rule_group="/r/a.yml;amdgpu-recording"} 0.25
prometheus_rule_group_last_duration_seconds_other 9
prometheus_rule_group_interval_seconds{rule_group="/r/a.yml;amdgpu-recording"} 30
prometheus_rule_group_iterations_total{rule_group="/r/a.yml;amdgpu-recording"} 12
prometheus_rule_group_iterations_missed_total{rule_group="/r/a.yml;amdgpu-recording"} 1
prometheus_remote_storage_highest_timestamp_in_seconds 1000
prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name="a",url="http://c:1/api/v1/write"} 996
prometheus_remote_storage_queue_highest_sent_timestamp_seconds{remote_name="b",url="http://v:2/api/v1/write"} 1000
prometheus_remote_storage_samples_pending{remote_name="a",url="http://c:1/api/v1/write"} 2500
prometheus_remote_storage_samples_total{remote_name="a",url="http://c:1/api/v1/write"} 1.5e+06
prometheus_remote_storage_samples_failed_total{remote_name="a",url="http://c:1/api/v1/write"} 3
"""


def test_metric_samples_match_the_whole_name() -> None:
    samples = metric_samples(PROMETHEUS_METRICS, "prometheus_rule_group_last_duration_seconds")
    assert samples == [({"rule_group": "/r/a.yml;amdgpu-recording"}, 0.25)]


def test_rule_groups_are_read_by_their_name() -> None:
    assert rule_groups(PROMETHEUS_METRICS) == {
        "amdgpu-recording": {"last": 0.25, "interval": 30, "iterations": 12, "missed": 1}
    }


def test_remote_write_lag_is_the_newest_appended_minus_the_newest_sent() -> None:
    queues = remote_writes(PROMETHEUS_METRICS)
    central = queues["http://c:1/api/v1/write"]
    assert central["lag"] == 4
    assert (central["pending"], central["sent"], central["failed"]) == (2500, 1.5e6, 3)
    assert queues["http://v:2/api/v1/write"]["lag"] == 0


def test_vmalert_groups_read_its_summary() -> None:
    body = (
        'vmalert_iteration_duration_seconds{group="g", file="/r/a.yml",quantile="1"} 0.5\n'
        'vmalert_iteration_duration_seconds{group="g", file="/r/a.yml",quantile="0.5"} 0.1\n'
        'vmalert_iteration_duration_seconds_sum{group="g", file="/r/a.yml"} 2\n'
        'vmalert_iteration_duration_seconds_count{group="g", file="/r/a.yml"} 8\n'
        'vmalert_iteration_interval_seconds{group="g", file="/r/a.yml"} 60\n'
        'vmalert_iteration_missed_total{group="g", file="/r/a.yml"} 0\n'
    )
    assert vmalert_groups(body) == {"g": {"last": 0.5, "sum": 2, "count": 8, "interval": 60, "missed": 0}}


def test_group_summary_counts_only_what_happened_while_measuring() -> None:
    samples = {
        "central": [
            {"g": {"last": 1.0, "interval": 30, "iterations": 1, "missed": 2}},
            {"g": {"last": 3.0, "interval": 30, "iterations": 2, "missed": 3}},
        ],
        "vmalert": [
            # vmalert's summary has no quantiles yet after its first evaluations
            {"v": {"sum": 2.0, "count": 4, "interval": 60, "iterations": 4, "missed": 0}},
            {"v": {"last": 0.9, "sum": 5.0, "count": 6, "interval": 60, "iterations": 6, "missed": 0}},
        ],
    }
    out = summarise_groups(samples, {"central": {"g": 2}, "vmalert": {"v": 0}})
    assert out["central"]["g"] | {} == {
        "mean": 2.0,
        "max": 3.0,
        "interval": 30,
        "iterations": 2,
        "missed": 1,
        "missed_total": 3,
    }
    assert out["vmalert"]["v"]["mean"] == pytest.approx(1.5)  # (5 - 2) / (6 - 4)
    assert out["vmalert"]["v"]["max"] == 0.9


def test_queue_summary_names_the_stores() -> None:
    points: list[dict[str, dict[str, float]]] = [
        {"http://c/w": {"sent": 10, "pending": 5, "lag": 1, "shards": 1}},
        {"http://c/w": {"sent": 20, "pending": 1, "lag": 3, "shards": 2, "failed": 1}},
    ]
    out = summarise_queues({"shard-1": points}, {"http://c/w": "central"})
    assert out["shard-1"]["central"] == {
        "sent": 20,
        "failed": 1,
        "retried": 0,
        "dropped": 0,
        "pending_max": 5,
        "shards_max": 2,
        "lag_mean": 2,
        "lag_max": 3,
    }


def _vector(*items: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in items]}


def test_two_stores_answer_the_same_within_jitter_and_names_aside() -> None:
    prometheus = _vector(({"node": "a"}, 100.0), ({"node": "b"}, 0.0))
    victoria = _vector(({"node": "a", "__name__": "x"}, 105.0), ({"node": "b"}, 0.01))
    assert compare(prometheus, victoria) == ""
    assert compare(prometheus, _vector(({"node": "a"}, 150.0), ({"node": "b"}, 0.0))) == "1 of 2 values differ"
    assert compare(prometheus, _vector(({"node": "a"}, 100.0))).startswith("series differ: 2 and 1")
    scalar = {"resultType": "scalar", "result": [0, "NaN"]}
    assert compare(scalar, scalar) == ""
