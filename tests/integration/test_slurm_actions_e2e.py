"""The Slurm action mode against a real Slurm: Debian's slurmctld and slurmd (tests/slurm_cluster.py), the
real daemon on a simulated node with an uncorrectable ECC fault, and what Slurm's own sinfo says.

The daemon's ECC window is 8 s (a rule file of the run), so a fault of 10 s leaves the GPU unfit for
~18 s and fit again after; the retry interval is 1 s. The partition `gpu` has 10 nodes: at the default
share 0.1 one may be out of service at a time.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Daemon, Series, start_daemon, value, wait_until
from tests.slurm_cluster import SlurmCluster, slurm_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DAEMON_RULES = "rules: []\nhealth:\n  checks:\n    ecc_uncorrectable: {window: 8s}\n"
FAULT = "idle:faults=ecc_ue.0,fault_at=2,fault_for=10"
REASON = "amdgpu-exporter: gpu 0: ecc_uncorrectable"
ADMIN = "admin: DIMM swap, ticket 4711"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path / "slurm") as running:
        yield running


def exporter(cluster: SlurmCluster, folder: Path, node: str, scenario: str, *args: str) -> Daemon:
    rules = folder / "rules.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    rules.write_text(DAEMON_RULES, encoding="utf-8")
    return start_daemon(
        folder,
        "--demo",
        "--demo.fleet=1xMI300X",
        f"--demo.scenario={scenario}",
        f"--rules.file={rules}",
        "--interval=500ms",
        "--slow-interval=1s",
        f"--node-name={node}",
        "--action.slurm.retry-interval=1s",
        *args,
        env=cluster.env,
    )


def actions(series: Series, action: str, outcome: str) -> float:
    return value(series, "amdgpu_exporter_actions_total", action=action, outcome=outcome) or 0.0


def test_a_drain_waits_for_the_partition_share_and_the_resume_for_the_rate_limit(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster.drain("node5", ADMIN)  # partition gpu: 1 of 10 out of service, the whole share
    daemon = exporter(
        cluster,
        tmp_path / "exporter",
        "node1",
        FAULT,
        "--action.slurm=on",
        "--action.slurm.max-actions=1",
        "--action.slurm.actions-interval=30s",
    )
    try:
        # The GPU fails: the drain is refused while it would take a second node of gpu out of service.
        daemon.wait_for(lambda s: actions(s, "drain", "refused_share") >= 1, "a refused drain")
        assert cluster.node_state("node1") == ("idle", "none")
        refused = daemon.events("slurm_action")[0]
        assert refused["outcome"] == "refused_share" and refused["action"] == "drain" and refused["node"] == "node1"
        assert refused["reasons"] == REASON
        assert "partition gpu would have 2 of its 10 nodes out of service" in refused["detail"]
        # The administrator puts node5 back: the drain is tried again and now done, with the marker.
        cluster.resume("node5")
        wait_until(lambda: cluster.node_state("node1")[0] == "drained", "node1 drained", 60, daemon.process)
        assert cluster.node_state("node1") == ("drained", REASON)
        series = daemon.wait_for(lambda s: actions(s, "drain", "done") == 1, "the drain counted")
        assert actions(series, "drain", "failed") == 0
        # The GPU is fit again within the 30 s of the drain: the one action allowed is spent.
        daemon.wait_for(lambda s: actions(s, "resume", "rate_limited") >= 1, "a rate-limited resume")
        assert cluster.node_state("node1") == ("drained", REASON)
        # Then the interval has room again: resumed.
        wait_until(lambda: cluster.node_state("node1")[0].rstrip("*") == "idle", "node1 resumed", 90, daemon.process)
        series = daemon.wait_for(lambda s: actions(s, "resume", "done") == 1, "the resume counted")
        assert actions(series, "drain", "done") == 1 and actions(series, "resume", "failed") == 0
        done = [e for e in daemon.events("slurm_action") if e["outcome"] == "done"]
        assert [(e["action"], e["node"], e["reasons"]) for e in done] == [
            ("drain", "node1", REASON),
            ("resume", "node1", REASON),
        ]
        assert done[0]["command"].endswith(f"update NodeName=node1 State=DRAIN Reason={REASON}")
        note = daemon.get("/api/v1/health").json()["note"]
        assert note.startswith("Slurm action mode on")
        assert cluster.node_state("node5") == ("idle", "none")  # no other node was touched
    finally:
        daemon.stop()


def test_an_administrators_drain_is_never_resumed_and_a_drain_of_its_own_is_after_a_restart(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Healthy GPUs: node2 drained by an administrator stays drained; node3 drained with the marker (a
    previous run of the exporter left it) is resumed by the next, and only reported by a dry run. A dry
    run on node6 with the fault reports the drain and then the resume, and changes nothing."""
    cluster.drain("node2", ADMIN)
    cluster.drain("node3", REASON)
    admin = exporter(cluster, tmp_path / "node2", "node2", "idle", "--action.slurm=on")
    dry = exporter(cluster, tmp_path / "node3-dry", "node3", "idle", "--action.slurm=dry-run")
    # node2 and node3 are 2 of gpu's 10: a share of 0.5 leaves room for node6
    faulty = exporter(
        cluster,
        tmp_path / "node6-dry",
        "node6",
        FAULT,
        "--action.slurm=dry-run",
        "--action.slurm.max-drained-share=0.5",
    )
    try:
        faulty.wait_for(lambda s: actions(s, "drain", "dry_run") == 1, "the dry run's drain")
        assert cluster.node_state("node6") == ("idle", "none")
        series = admin.wait_for(lambda s: actions(s, "resume", "refused_foreign") == 1, "the admin's drain kept")
        assert sum(v for (name, _), v in series.items() if name == "amdgpu_exporter_actions_total") == 1
        series = dry.wait_for(lambda s: actions(s, "resume", "dry_run") == 1, "the dry run's resume")
        assert actions(series, "resume", "done") == 0
        admin.wait_cycles(4)
        dry.wait_cycles(2)
        assert cluster.node_state("node2") == ("drained", ADMIN)
        assert cluster.node_state("node3") == ("drained", REASON)
        assert actions(admin.scrape(), "resume", "refused_foreign") == 1  # asked once, not every cycle
        assert dry.get("/api/v1/health").json()["note"].startswith("Slurm action mode dry-run")
        series = faulty.wait_for(lambda s: actions(s, "resume", "dry_run") == 1, "the dry run's resume", 90)
        assert actions(series, "drain", "dry_run") == 1 and actions(series, "drain", "done") == 0
        assert cluster.node_state("node6") == ("idle", "none")
        would = [e for e in faulty.events("slurm_action") if e["outcome"] == "dry_run"]
        assert [e["action"] for e in would] == ["drain", "resume"]
        assert would[0]["command"].endswith(f"update NodeName=node6 State=DRAIN Reason={REASON}")
        assert would[1]["reasons"] == REASON and would[1]["command"].endswith("update NodeName=node6 State=RESUME")
    finally:
        admin.stop()
        dry.stop()
        faulty.stop()
    again = exporter(cluster, tmp_path / "node3", "node3", "idle", "--action.slurm=on")
    try:
        again.wait_for(lambda s: actions(s, "resume", "done") == 1, "the marked drain resumed")
        assert cluster.node_state("node3")[0].rstrip("*") == "idle"
        assert cluster.node_state("node2") == ("drained", ADMIN)
    finally:
        again.stop()


def test_a_hung_controller_costs_the_action_not_the_cycle(cluster: SlurmCluster, tmp_path: Path) -> None:
    """slurmctld stopped (SIGSTOP): sinfo connects and waits for an answer that never comes. Each try is
    killed at the 1 s timeout and counted as failed while the daemon keeps publishing cycles; once the
    controller runs again the drain is done."""
    controller = cluster.processes[0]
    os.kill(controller.pid, signal.SIGSTOP)
    daemon = None
    try:
        daemon = exporter(
            cluster, tmp_path / "exporter", "node4", FAULT, "--action.slurm=on", "--action.slurm.timeout=1s"
        )
        daemon.wait_for(lambda s: actions(s, "drain", "failed") >= 2, "two failed drains")
        daemon.wait_cycles(3)  # the cycles go on while each try hangs until it is killed
        failed = [e for e in daemon.events("slurm_action") if e["outcome"] == "failed"]
        assert "did not finish within 1 s" in failed[0]["detail"]
    finally:
        os.kill(controller.pid, signal.SIGCONT)
    try:
        wait_until(lambda: cluster.node_state("node4") == ("drained", REASON), "node4 drained", 60, daemon.process)
    finally:
        daemon.stop()
