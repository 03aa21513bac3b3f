"""The accounting stage as the cycle runs it: the pure `account` step, then the edges (the state
file, the log line of each job's end)."""

from __future__ import annotations

from exporter.accounting.document import accounting_record, job_document
from exporter.accounting.ledger import DEFAULT_LIMITS, Ledger, Limits, account
from exporter.accounting.store import LedgerStore
from exporter.log import get_logger
from exporter.model import HealthVerdict, Snapshot

log = get_logger("exporter.accounting")


class Accounting:
    """Holds the ledger between cycles; `store` None keeps it in memory only."""

    def __init__(self, store: LedgerStore | None = None, limits: Limits = DEFAULT_LIMITS, node: str = "") -> None:
        self.store = store
        self.limits = limits
        self.node = node
        self.ledger = store.load() if store is not None else Ledger()

    def on_cycle(self, snapshot: Snapshot, health: HealthVerdict | None) -> Ledger:
        before = self.ledger
        ledger, ended = account(before, snapshot, health, self.limits)
        self.ledger = ledger
        started = {j.job_id for j in ledger.running} - {j.job_id for j in before.running}
        for job_id in sorted(started):
            job = ledger.find(job_id)
            if job is not None:
                log.info("job_started", job_id=job.job_id, scheduler=job.scheduler, gpus=list(job.held_gpus))
        for job in ended:
            document = job_document(job, self.node, history=False)
            totals = document["totals"]
            log.info(
                "job_accounted",
                job_id=job.job_id,
                scheduler=job.scheduler,
                gpus=document["gpus"],
                seconds=round(document["duration_seconds"], 3),
                energy_joules=round(totals["energy_joules"], 3),
                gpu_seconds=round(totals["gpu_seconds"], 3),
                failed_checks=totals["failed_checks"],
                record=accounting_record(document),
            )
        if self.store is not None and (ledger.running or ended or before.running):
            self.store.save(ledger, durable=bool(started or ended))
        return ledger

    def close(self) -> None:
        """The last cycle's ledger on disk (SIGTERM): the next start charges the gap from it."""
        if self.store is not None:
            self.store.save(self.ledger)
