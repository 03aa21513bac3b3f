"""The daemon's web layer is Starlette, without FastAPI and pydantic (~16 MB of resident memory the
routes never used): nothing the daemon imports pulls them in, and the routes answer as before."""

from __future__ import annotations

import subprocess
import sys

from starlette.testclient import TestClient

from exporter.cycle import PublishedState
from exporter.web.routes import create_app

UNUSED = ("fastapi", "pydantic", "pydantic_core", "opentelemetry")


def test_the_daemon_imports_neither_fastapi_nor_pydantic() -> None:
    code = (
        "import sys, exporter.cli, exporter.daemon, exporter.web.routes;"
        f"print(','.join(m for m in {UNUSED!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_routes_are_get_only_and_errors_are_bare() -> None:
    client = TestClient(create_app(lambda: PublishedState(), "/metrics", node="n1"))
    assert client.get("/healthz").status_code == 200
    head = client.head("/healthz")
    assert head.status_code == 405  # as FastAPI answered: GET routes only
    missing = client.get("/no/such/page")
    assert (missing.status_code, missing.text) == (404, "not found\n")
    post = client.post("/api/v1/jobs")
    assert (post.status_code, post.text) == (405, "method not allowed\n")
    assert client.get("/api/v1/jobs/ns/pod-1").json() == {"error": client.get("/api/v1/jobs").json()["error"]}
    assert client.get("/readyz").status_code == 503  # no cycle yet
    assert client.get("/api/v1/devices/x/cper").status_code == 400
