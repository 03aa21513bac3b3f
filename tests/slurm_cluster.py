"""A real Slurm controller for tests: Debian's slurmctld and one slurmd, in a temporary folder, on free ports.

Twenty nodes, node1..node20, in two partitions: `gpu` (node1..node10) and `all` (node1..node20). Each
node's address is its own loopback address (127.0.0.N), all on one SlurmdPort, so the one slurmd
started (as node1) answers the controller for every node and they all come up idle, as the nodes of a
real cluster with their slurmd running do. `AuthType=auth/none` (Slurm 22.05 still ships the plugin):
no munge daemon and no key; the client commands find the controller through SLURM_CONF (`env`).

Needs root (SlurmUser=root, as on a real controller) and the Debian packages slurmctld, slurmd and
slurm-client (DEBIAN_TEST_PACKAGES in the Makefile): a missing one fails the test under CI=true.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.harness import free_port, wait_until
from tests.realtools import require_root, require_tool

NODES = 20
GPU_PARTITION = 10  # node1..node10 are in partition gpu as well as in all


class SlurmCluster:
    """A running slurmctld and slurmd; `scontrol`, `node_state` and `env` for the test."""

    def __init__(self, folder: Path) -> None:
        require_root()
        self.slurmctld = require_tool("slurmctld", "/usr/sbin")
        self.slurmd = require_tool("slurmd", "/usr/sbin")
        self.scontrol_bin = require_tool("scontrol")
        self.sinfo_bin = require_tool("sinfo")
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes: list[subprocess.Popen[bytes]] = []

    def write_conf(self) -> None:
        state = self.folder / "state"
        spool = self.folder / "spool"
        state.mkdir(parents=True, exist_ok=True)
        spool.mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        nodes = "\n".join(f"NodeName=node{n} NodeAddr=127.0.0.{n} CPUs=1 State=UNKNOWN" for n in range(1, NODES + 1))
        self.conf.write_text(
            f"""ClusterName=amdgpuexportertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPidFile={self.folder}/slurmctld.pid
SlurmdPidFile={self.folder}/slurmd.pid
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldLogFile={self.folder}/slurmctld.log
SlurmdLogFile={self.folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
{nodes}
PartitionName=gpu Nodes=node[1-{GPU_PARTITION}] Default=YES State=UP
PartitionName=all Nodes=node[1-{NODES}] State=UP
""",
            encoding="utf-8",
        )

    def start(self) -> None:
        self.write_conf()
        self._spawn([self.slurmctld, "-D", "-i"], "slurmctld.out")
        wait_until(lambda: self.run_sinfo("--noheader").returncode == 0, "slurmctld answering sinfo", 60)
        self._spawn([self.slurmd, "-D", "-N", "node1"], "slurmd.out")
        wait_until(
            lambda: set(self.sinfo("--noheader", "--Node", "--format=%T").split()) == {"idle"},
            f"every node idle: {self.sinfo('--noheader', '--Node', '--format=%N %T')}",
            120,
            step=0.5,
        )

    def _spawn(self, argv: Sequence[str], out: str) -> None:
        with (self.folder / out).open("wb") as log:
            self.processes.append(
                subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)  # its own session: slurmctld's slurmscriptd goes too
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(5)

    def run_sinfo(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.sinfo_bin, *args], env=self.env, capture_output=True, text=True, timeout=30)

    def sinfo(self, *args: str) -> str:
        done = self.run_sinfo(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def scontrol(self, *args: str) -> str:
        done = subprocess.run([self.scontrol_bin, *args], env=self.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"scontrol {' '.join(args)}: {done.stderr}"
        return done.stdout

    def drain(self, node: str, reason: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self.scontrol("update", f"NodeName={node}", "State=RESUME")

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) of a node as sinfo shows it: ("drained", "amdgpu-exporter: ..."), ("idle", "none")."""
        lines = self.sinfo("--noheader", "--Node", f"--nodes={node}", "--format=%T|%E").splitlines()
        state, reason = lines[0].split("|", 1)
        return state.strip(), reason.strip()

    def log_tail(self) -> str:
        return (self.folder / "slurmctld.log").read_text(errors="replace")[-3000:]


@contextmanager
def slurm_cluster(folder: Path) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
