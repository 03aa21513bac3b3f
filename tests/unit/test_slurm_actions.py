"""The Slurm action mode's pure parts: sinfo's text parsed (fuzzed), the share guard, the settings, the
start-up checks and the counters' family. What it does against a real Slurm: tests/integration/
test_slurm_actions_e2e.py."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter import config
from exporter.actions.slurm_state import (
    NodeState,
    PartitionCount,
    SlurmOutputError,
    drain_within_share,
    is_ours,
    parse_counts,
    parse_node,
)
from exporter.daemon import slurm_actions
from exporter.exposition.render import render
from exporter.model import ACTION_OUTCOMES, ACTIONS, ActionStats, ExporterStats, Published, Snapshot, frozen_map

# As Debian's sinfo 22.05.8 printed them in tests/integration/test_slurm_actions_e2e.py's cluster.
OURS = "amdgpu-exporter: gpu 0: ecc_uncorrectable"
NODE_LINES = f"gpu|drained|{OURS}\nall|drained|{OURS}\n"
COUNT_LINES = "gpu|1|idle*\ngpu|1|drained\ngpu|8|idle\nall|1|idle*\nall|1|drained\nall|18|idle\n"


def test_a_node_in_two_partitions() -> None:
    node = parse_node(NODE_LINES, "node1")
    assert node == NodeState(("gpu", "all"), "drained", OURS)
    assert node.drained and node.out_of_service and is_ours(node.reason)
    idle = parse_node("gpu|idle*|none\n", "node1")
    assert idle.reason == "" and not idle.drained and not idle.out_of_service


def test_a_reason_keeps_its_separators_and_an_admins_is_not_ours() -> None:
    node = parse_node("gpu|draining|admin: a|b|c [root@2026-12-03T16:00:00]\n", "n")
    assert node.reason == "admin: a|b|c [root@2026-12-03T16:00:00]" and node.drained and not is_ours(node.reason)


def test_no_line_or_two_states_is_an_error_naming_the_node() -> None:
    with pytest.raises(SlurmOutputError, match="node n7 in no partition"):
        parse_node("\n", "n7")
    with pytest.raises(SlurmOutputError, match="more than one state"):
        parse_node("gpu|idle|none\nall|drained|x\n", "n7")
    with pytest.raises(SlurmOutputError, match="line 1 is not partition"):
        parse_node("gpu idle none\n", "n7")


def test_counts_sum_each_partitions_lines() -> None:
    assert parse_counts(COUNT_LINES) == {"gpu": PartitionCount(10, 1), "all": PartitionCount(20, 1)}
    assert parse_counts("p|3|down*\np|2|drng\np|1|fail\np|4|mixed\n") == {"p": PartitionCount(10, 6)}
    with pytest.raises(SlurmOutputError, match="line 2"):
        parse_counts("p|3|idle\np|x|idle\n")


def test_the_share_counts_every_partition_of_the_node() -> None:
    counts = parse_counts(COUNT_LINES)
    node = NodeState(("gpu", "all"), "idle", "")
    refused = drain_within_share(node, counts, 0.1)
    assert not refused.allowed and "partition gpu would have 2 of its 10 nodes out of service" in refused.detail
    assert drain_within_share(node, counts, 0.2).allowed
    assert drain_within_share(NodeState(("all",), "idle", ""), counts, 0.1).allowed  # 2 of 20
    # a node that is down already adds nothing by being drained
    assert drain_within_share(NodeState(("gpu",), "down*", ""), counts, 0.1).allowed
    unknown = drain_within_share(NodeState(("other",), "idle", ""), counts, 1.0)
    assert not unknown.allowed and "no node count for partition other" in unknown.detail


_STATES = st.sampled_from(["idle", "mixed", "allocated", "drained", "draining", "down*", "fail", "idle~", "drng"])


@given(st.text(max_size=300))
def test_any_text_parses_or_raises_its_own_error(text: str) -> None:
    for parse in (lambda t: parse_node(t, "n1"), parse_counts):
        with contextlib.suppress(SlurmOutputError):
            parse(text)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 500), _STATES), max_size=12))
def test_counts_add_up_whatever_the_grouping(rows: list[tuple[str, int, str]]) -> None:
    counts = parse_counts("".join(f"{p}|{n}|{s}\n" for p, n, s in rows))
    for partition in {p for p, _, _ in rows}:
        mine = [(n, s) for p, n, s in rows if p == partition]
        out = sum(n for n, s in mine if s.rstrip("*~").startswith(("drain", "drng", "down", "fail")))
        assert counts[partition] == PartitionCount(sum(n for n, _ in mine), out)


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.tuples(st.integers(1, 200), st.integers(0, 200)), min_size=1),
    st.floats(0.001, 1.0),
)
def test_a_drain_is_allowed_only_within_the_share_of_every_partition(
    figures: dict[str, tuple[int, int]], share: float
) -> None:
    counts = {p: PartitionCount(n, min(out, n - 1)) for p, (n, out) in figures.items()}
    check = drain_within_share(NodeState(tuple(counts), "idle", ""), counts, share)
    assert check.allowed == all(c.out_of_service + 1 <= share * c.nodes + 1e-9 for c in counts.values())


def settings(*flags: str, environ: dict[str, str] | None = None) -> config.Settings:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.resolve(parser.parse_args(["--demo", *flags]), environ or {})


def test_the_mode_is_off_unless_asked_for_and_a_config_files_yaml_on_means_on(tmp_path: Path) -> None:
    assert settings().action_slurm == "off" and slurm_actions(settings()) is None
    file = tmp_path / "config.yaml"
    file.write_text("action.slurm: on\naction:\n  slurm.max-drained-share: 0.25\n", encoding="utf-8")
    resolved = settings(f"--config.file={file}")
    assert (resolved.action_slurm, resolved.action_slurm_max_drained_share) == ("on", 0.25)
    assert settings(environ={"AMDGPU_EXPORTER_ACTION_SLURM": "dry-run"}).action_slurm == "dry-run"
    defaults = settings()
    assert (defaults.action_slurm_max_actions, defaults.action_slurm_actions_interval) == (2, 3600.0)
    assert (defaults.action_slurm_retry_interval, defaults.action_slurm_timeout) == (60.0, 10.0)


@pytest.mark.parametrize(
    ("flag", "words"),
    [
        ("--action.slurm=yes", "'yes' is not one of off, dry-run, on"),
        ("--action.slurm.max-drained-share=0", "must be above 0 and at most 1"),
        ("--action.slurm.max-drained-share=1.5", "must be above 0 and at most 1"),
        ("--action.slurm.max-actions=0", "must be at least 1"),
    ],
)
def test_bad_values_are_one_clear_sentence(flag: str, words: str) -> None:
    with pytest.raises(config.ConfigError, match=words):
        settings(flag)


def test_a_missing_scontrol_or_a_bad_node_name_stops_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(config.ConfigError, match="scontrol and sinfo not found on PATH"):
        slurm_actions(settings("--action.slurm=on", "--node-name=node1"))
    with pytest.raises(config.ConfigError, match="is not a Slurm node name"):
        slurm_actions(settings("--action.slurm=dry-run", "--node-name=-x node"))


def test_the_counters_are_there_with_the_mode_only() -> None:
    empty = Snapshot(devices=(), taken_at=0.0)
    off = render(Published(snapshot=empty)).body(openmetrics=False, gzipped=False).decode()
    assert "amdgpu_exporter_actions" not in off
    counts = frozen_map({(a, o): 0 for a in ACTIONS for o in ACTION_OUTCOMES} | {("drain", "done"): 1})
    stats = ExporterStats(actions=ActionStats(mode="on", counts=counts))
    on = render(Published(snapshot=empty, stats=stats)).body(openmetrics=False, gzipped=False).decode()
    lines = [line for line in on.splitlines() if line.startswith("amdgpu_exporter_actions_total{")]
    assert len(lines) == len(ACTIONS) * len(ACTION_OUTCOMES)
    assert 'amdgpu_exporter_actions_total{action="drain",outcome="done"} 1.0' in lines
