"""The Slurm action mode (--action.slurm=dry-run|on): run the drain and the resume the health verdict
suggests, within stated bounds.

    actions = SlurmActions(node, policy)
    task = asyncio.create_task(actions.run(stop))   # the background actor
    actions.update(verdict)                         # after each cycle's verdict: never blocks
    actions.stats                                   # ActionStats, copied into what a cycle publishes

The verdict wants the node drained while a GPU is unfit (`HealthVerdict.drain_reason`) and resumed once
every GPU is fit. The actor acts on a change of that wish, never on every cycle:

- a drain first asks sinfo for the node (already drained by anyone: nothing to do) and for the
  partitions it is in; it is refused (logged, counted, tried again after --action.slurm.retry-interval)
  when any of them would have more than --action.slurm.max-drained-share of its nodes out of service;
- a resume only ever undoes the exporter's own drain: the node's reason must start with the marker
  (`amdgpu-exporter:`); an administrator's drain is left alone, whatever the GPUs say;
- at most --action.slurm.max-actions commands run per --action.slurm.actions-interval (drains and
  resumes together); an action over it waits (rate_limited) and is tried again;
- every command runs as a subprocess without a shell, with a timeout, on a thread of its own: a hung
  or failing scontrol costs that action (failed, tried again), never a poll cycle or /metrics;
- the actor's memory is what Slurm says: after a restart a fit node drained with the marker is resumed,
  and a node an administrator resumed while a GPU was unfit is not drained again (the admin decided)
  until the verdict wants the node drained anew after a fit verdict.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.actions.slurm_state import (
    COUNTS_FORMAT,
    NODE_FORMAT,
    NodeState,
    SlurmOutputError,
    drain_within_share,
    is_ours,
    parse_counts,
    parse_node,
)
from exporter.log import get_logger
from exporter.model import ACTION_OUTCOMES, ACTIONS, ActionStats, HealthVerdict, frozen_map
from exporter.threads import DaemonPool

log = get_logger("exporter.actions.slurm")

MODES = ("off", "dry-run", "on")
OUTPUT_LIMIT = 1 << 20  # sinfo's answers are a few lines; more is not Slurm's


@dataclass(frozen=True, slots=True)
class ActionPolicy:
    """The bounds of the Slurm action mode (the --action.slurm.* settings)."""

    mode: str = "dry-run"  # dry-run | on
    max_drained_share: float = 0.1
    max_actions: int = 2
    actions_interval: float = 3600.0
    retry_interval: float = 60.0
    timeout: float = 10.0
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"


class CommandFailed(Exception):
    """A command that exited non-zero, timed out or could not start; the message says which and why."""


def run_command(argv: Sequence[str], timeout: float) -> str:
    """Run argv (no shell) to completion within `timeout` seconds; its standard output, or CommandFailed."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, errors="replace", timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise CommandFailed(f"{argv[0]} did not finish within {timeout:g} s (killed)") from None
    except OSError as error:
        raise CommandFailed(f"{argv[0]} could not be run: {error.strerror or error}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().replace("\n", " ")[:300]
        raise CommandFailed(f"{argv[0]} exited with {done.returncode}: {said or 'no message'}")
    return done.stdout[:OUTPUT_LIMIT]


class SlurmActions:
    """Drains and resumes this node in Slurm as the health verdict wants, within the policy's bounds."""

    def __init__(
        self,
        node: str,
        policy: ActionPolicy,
    ) -> None:
        self.node = node
        self.policy = policy
        self._verdict: HealthVerdict | None = None
        self._wake = asyncio.Event()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._done_at: deque[float] = deque()  # when each command counted by the rate limit ran
        self._drained: bool | None = None  # as far as the actor knows; None: not asked yet
        self._simulated = ""  # dry-run: the reason of the drain it would have made, until its resume
        self._retry_at = 0.0
        self._last_logged: tuple[str, str] | None = None
        self._pool = DaemonPool(1, "slurm-action")
        self.stats = ActionStats()
        self._publish()

    def update(self, verdict: HealthVerdict) -> None:
        """The newest verdict (after each cycle); the actor acts on it in its own time."""
        self._verdict = verdict
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Act on each new verdict until `stop`; an action that failed or was refused is tried again after
        the retry interval."""
        while not stop.is_set():
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            delay = max(0.0, self._retry_at - time.monotonic()) if self._retry_at else None
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            self._wake.clear()
            if stop.is_set():
                break
            try:
                await self.step()
            except Exception:  # a bug here must not end the actor, nor the daemon: log it and go on
                log.exception("slurm_action_error", node=self.node)
                self._retry_at = time.monotonic() + self.policy.retry_interval
        self._pool.close()

    async def step(self) -> None:
        """One decision on the newest verdict: drain, resume or nothing."""
        verdict = self._verdict
        if verdict is None or (self._retry_at and time.monotonic() < self._retry_at):
            return
        self._retry_at = 0.0
        if verdict.drain_reason and self._drained is not True:
            await self._drain(verdict.drain_reason)
        elif verdict.fit and self._drained is not False:
            await self._resume()
        self._publish()

    # --- the two actions ------------------------------------------------------------------------------

    async def _drain(self, reason: str) -> None:
        # Nodes whose GPUs fail at one moment (a fleet-wide fault, a bad rule file) ask Slurm at spread
        # moments, so that each sees the drains of those before it.
        await asyncio.sleep(random.uniform(0.0, self.policy.retry_interval / 2))
        if self._verdict is None or not self._verdict.drain_reason:
            return  # fit again meanwhile: nothing to drain
        reason = self._verdict.drain_reason
        state = await self._node_state("drain", reason)
        if state is None:
            return
        if state.drained:
            self._drained = True  # out of service already, by this exporter or by someone else: left as is
            log.info("slurm_already_drained", node=self.node, reason=state.reason, ours=is_ours(state.reason))
            return
        partitions = ",".join(state.partitions)
        argv = [self.policy.sinfo, "--noheader", f"--partition={partitions}", f"--format={COUNTS_FORMAT}"]
        try:
            counts = parse_counts(await self._call(argv))
        except (CommandFailed, SlurmOutputError) as error:
            self._outcome("drain", "failed", reason, detail=str(error))
            return
        share = drain_within_share(state, counts, self.policy.max_drained_share)
        if not share.allowed:
            self._outcome("drain", "refused_share", reason, detail=share.detail)
            return
        command = [self.policy.scontrol, "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={reason}"]
        if await self._act("drain", reason, command, share.detail):
            self._drained = True

    async def _resume(self) -> None:
        state = await self._node_state("resume", "")
        if state is None:
            return
        command = [self.policy.scontrol, "update", f"NodeName={self.node}", "State=RESUME"]
        if not state.drained:
            if not self._simulated:
                self._drained = False
            elif await self._act("resume", self._simulated, command, "every GPU is fit"):
                self._drained = False  # dry-run: the resume of the drain it would have made
            return
        if not is_ours(state.reason):
            # An administrator's drain (or another tool's): never resumed by the exporter. Asked once per
            # wish to resume: the next ask comes after the exporter has drained the node itself.
            self._outcome("resume", "refused_foreign", state.reason, detail="the node is drained by someone else")
            self._drained = False
            return
        if await self._act("resume", state.reason, command, "every GPU is fit"):
            self._drained = False

    # --- helpers --------------------------------------------------------------------------------------

    async def _node_state(self, action: str, reasons: str) -> NodeState | None:
        argv = [self.policy.sinfo, "--noheader", "--all", "--Node", f"--nodes={self.node}", f"--format={NODE_FORMAT}"]
        try:
            return parse_node(await self._call(argv), self.node)
        except (CommandFailed, SlurmOutputError) as error:
            self._outcome(action, "failed", reasons, detail=str(error))
            return None

    def _act_allowed(self, action: str, reasons: str) -> bool:
        """Whether the rate limit leaves room for one more command now; counted and logged when not."""
        now = time.monotonic()
        while self._done_at and self._done_at[0] <= now - self.policy.actions_interval:
            self._done_at.popleft()
        if len(self._done_at) >= self.policy.max_actions:
            wait = self._done_at[0] + self.policy.actions_interval - now
            self._outcome(
                action,
                "rate_limited",
                reasons,
                detail=f"{self.policy.max_actions} actions within {self.policy.actions_interval:g} s; "
                f"room again in {wait:.0f} s",
            )
            return False
        self._done_at.append(now)
        return True

    async def _act(self, action: str, reasons: str, command: list[str], detail: str) -> bool:
        """Run the command (on) or say it would be (dry-run), within the rate limit; True when done."""
        if not self._act_allowed(action, reasons):
            return False
        if self.policy.mode != "on":
            self._outcome(action, "dry_run", reasons, detail=detail, command=command)
            self._simulated = reasons if action == "drain" else ""
            return True
        try:
            await self._call(command)
        except CommandFailed as error:
            self._outcome(action, "failed", reasons, detail=str(error), command=command)
            return False
        self._outcome(action, "done", reasons, detail=detail, command=command)
        return True

    async def _call(self, argv: Sequence[str]) -> str:
        """The command run on the actor's thread; a thread stuck past the timeout is abandoned."""
        future = self._pool.submit(run_command, argv, self.policy.timeout)
        try:
            # subprocess.run kills the child at the timeout; the margin covers reaping it
            return await asyncio.wait_for(asyncio.wrap_future(future), self.policy.timeout + 5.0)
        except TimeoutError:
            self._pool.close()  # the stuck thread is left behind (a daemon thread); the next call gets a new one
            self._pool = DaemonPool(1, "slurm-action")
            raise CommandFailed(f"{argv[0]} did not return within {self.policy.timeout + 5.0:g} s") from None

    def _outcome(self, action: str, outcome: str, reasons: str, *, detail: str, command: Sequence[str] = ()) -> None:
        """Count, log and, for an outcome that leaves the wish unmet, schedule the retry."""
        self._counts[action, outcome] += 1
        self._publish()
        if outcome in ("refused_share", "rate_limited", "failed"):
            self._retry_at = time.monotonic() + self.policy.retry_interval
        fields = {"action": action, "node": self.node, "reasons": reasons, "outcome": outcome, "detail": detail}
        if command:
            fields["command"] = " ".join(command)
        repeated = self._last_logged == (action, outcome) and outcome in ("refused_share", "rate_limited", "failed")
        self._last_logged = (action, outcome)
        if repeated:  # the same refusal every retry interval: once at warning, then at debug
            log.debug("slurm_action", **fields)
        elif outcome == "refused_foreign":
            log.info("slurm_action", **fields)
        else:
            log.warning("slurm_action", **fields)

    def _publish(self) -> None:
        self.stats = ActionStats(
            mode=self.policy.mode,
            counts=frozen_map({(a, o): self._counts[a, o] for a in ACTIONS for o in ACTION_OUTCOMES}),
            drained=self._drained,
        )
