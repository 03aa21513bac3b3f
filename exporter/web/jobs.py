"""/api/v1/jobs and /api/v1/jobs/{id}: what each job or pod used (exporter/accounting/, docs/accounting.md).

Read from the last cycle's ledger (PublishedState.jobs); a 404 names why: accounting is off (no
--slurm.state-dir nor --kubernetes), or no such job is running or kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from exporter.accounting.document import job_document, jobs_document
from exporter.cycle import PublishedState

OFF = "per-job accounting is off: it runs with --slurm.state-dir or --kubernetes"


def add_job_routes(app: Any, state_ref: Callable[[], PublishedState], node: str) -> None:
    @app.get("/api/v1/jobs")
    async def jobs() -> JSONResponse:
        ledger = state_ref().jobs
        if ledger is None:
            return JSONResponse({"error": OFF}, status_code=404)
        return JSONResponse(jobs_document(ledger.running, ledger.ended, node))

    # A pod's id is "namespace/name": the path converter keeps the slash.
    @app.get("/api/v1/jobs/{job_id:path}")
    async def job(job_id: str) -> JSONResponse:
        ledger = state_ref().jobs
        if ledger is None:
            return JSONResponse({"error": OFF}, status_code=404)
        found = ledger.find(job_id)
        if found is None:
            return JSONResponse({"error": f"no job {job_id!r} is running or kept on this node"}, status_code=404)
        return JSONResponse(job_document(found, node))
