"""What Slurm says about a node and its partitions, parsed from sinfo's text; and whether one more drain
keeps every partition within the allowed share. Pure functions over str: the commands are run by
exporter/actions/slurm.py.

The two queries (with `--noheader`; the first with `--all`, so a hidden partition of the node shows):

    sinfo --Node --nodes=NODE --format=%R|%T|%E   one line per partition of the node: state, reason
    sinfo --partition=P,Q --format=%R|%D|%T        per partition and state: how many nodes (a named
                                                  partition is shown even when hidden)

The reason (%E) comes last: it is the one free text, and may hold the separator itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.model import DRAIN_MARKER

NODE_FORMAT = "%R|%T|%E"
COUNTS_FORMAT = "%R|%D|%T"

# sinfo's suffixes on a state: * not responding, ~ powered off, # powering up, ! pending power down,
# % powering down, $ in a maintenance reservation, @ pending reboot, ^ rebooting, - planned
_STATE_SUFFIXES = "*~#!%$@^-"
# A drain (by anyone): the node takes no new job. DOWN+DRAIN is shown as drained too.
DRAIN_STATES = frozenset({"drain", "drained", "draining", "drng"})
# Out of service without a drain: counted against the share as a drained node is (neither runs jobs).
DOWN_STATES = frozenset({"down", "fail", "failing"})


class SlurmOutputError(ValueError):
    """sinfo's output is not what the format asked for; the message says which line and why."""


def base_state(text: str) -> str:
    """'drained*' -> 'drained', 'IDLE' -> 'idle'."""
    return text.strip().lower().rstrip(_STATE_SUFFIXES)


def is_drained(state: str) -> bool:
    return base_state(state) in DRAIN_STATES


def is_out_of_service(state: str) -> bool:
    return base_state(state) in DRAIN_STATES | DOWN_STATES


def is_ours(reason: str) -> bool:
    """A drain reason the exporter wrote (its marker first): the only drains it ever resumes."""
    return reason.strip().startswith(DRAIN_MARKER)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as sinfo shows it."""

    partitions: tuple[str, ...]
    state: str  # sinfo's %T of the node, e.g. "drained*", "idle", "mixed"
    reason: str  # "" when none ("none" is how sinfo writes no reason)

    @property
    def drained(self) -> bool:
        return is_drained(self.state)

    @property
    def out_of_service(self) -> bool:
        return is_out_of_service(self.state)


def parse_node(text: str, node: str) -> NodeState:
    """The lines of `sinfo --Node --nodes=NODE --format=%R|%T|%E` -> the node's state.

    No line: the node is in no partition sinfo can see (or Slurm does not know it); its lines disagreeing
    on the state is an error too, as it cannot be acted on."""
    partitions: list[str] = []
    states: set[str] = set()
    reasons: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("|", 2)
        if len(fields) != 3 or not fields[0].strip() or not fields[1].strip():
            raise SlurmOutputError(f"sinfo line {number} is not partition|state|reason: {line[:200]!r}")
        partition, state, reason = (field.strip() for field in fields)
        if partition not in partitions:
            partitions.append(partition)
        states.add(state)
        reasons.add("" if reason == "none" else reason)
    if not partitions:
        raise SlurmOutputError(f"sinfo shows node {node} in no partition (is --node-name Slurm's NodeName?)")
    if len(states) > 1 or len(reasons) > 1:
        raise SlurmOutputError(f"sinfo shows node {node} in more than one state: {sorted(states)}")
    return NodeState(partitions=tuple(partitions), state=states.pop(), reason=reasons.pop())


@dataclass(frozen=True, slots=True)
class PartitionCount:
    """How many nodes a partition has, and how many of them are out of service (drained, draining, down)."""

    nodes: int = 0
    out_of_service: int = 0


def parse_counts(text: str) -> dict[str, PartitionCount]:
    """The lines of `sinfo --partition=... --format=%R|%D|%T` -> partition -> its counts (lines of one
    partition and state are summed: sinfo may split a group)."""
    counts: dict[str, PartitionCount] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split("|")]
        if len(fields) != 3 or not fields[0] or not fields[1].isascii() or not fields[1].isdigit() or not fields[2]:
            raise SlurmOutputError(f"sinfo line {number} is not partition|nodes|state: {line[:200]!r}")
        partition, nodes, state = fields[0], int(fields[1]), fields[2]
        before = counts.get(partition, PartitionCount())
        counts[partition] = PartitionCount(
            nodes=before.nodes + nodes,
            out_of_service=before.out_of_service + (nodes if is_out_of_service(state) else 0),
        )
    return counts


@dataclass(frozen=True, slots=True)
class ShareCheck:
    """Whether draining the node keeps every one of its partitions within the share, and why not."""

    allowed: bool
    detail: str  # one sentence with the figures, for the log


def drain_within_share(node: NodeState, counts: Mapping[str, PartitionCount], max_share: float) -> ShareCheck:
    """Would the partitions of `node` have at most `max_share` of their nodes out of service with it drained?

    A partition sinfo gave no count for refuses (the figures are unknown, and a drain is never a guess).
    A node already out of service (down) adds nothing by being drained."""
    adds = 0 if node.out_of_service else 1
    figures = []
    for partition in node.partitions:
        count = counts.get(partition)
        if count is None or count.nodes <= 0:
            return ShareCheck(False, f"sinfo gave no node count for partition {partition}")
        after = count.out_of_service + adds
        figures.append(f"{partition}: {after} of {count.nodes}")
        if after > max_share * count.nodes + 1e-9:
            return ShareCheck(
                False,
                f"partition {partition} would have {after} of its {count.nodes} nodes out of service "
                f"({count.out_of_service} already), more than the allowed share {max_share:g}",
            )
    return ShareCheck(True, "out of service with this drain: " + ", ".join(figures))
