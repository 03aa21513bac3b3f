"""Issue 31 case 10: Node Problem Detector's check script against whatever answers on the port.

The real script (deploy/kubernetes/node-problem-detector/check_amdgpu_health.sh) run by sh, once with
python3 as its parser and once with jq only, against a hostile local HTTP server (an endless body, a
trickle, a truncated document that contains `"fit":true,`) and against the real daemon. It must stay
bounded in time and memory and fail closed: exit 0 only for a whole document that says fit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.realtools import require_tool, start_exporter, stop, wait_ready

pytestmark = pytest.mark.integration

NPD = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "node-problem-detector"
SCRIPT = NPD / "check_amdgpu_health.sh"

FIT = {"node": "n", "taken_at": 1.0, "fit": True, "unfit_gpus": [], "gpus": [{"gpu": 0, "fit": True, "checks": []}]}
UNFIT = {
    "node": "n",
    "taken_at": 1.0,
    "fit": False,
    "unfit_gpus": [1],
    "gpus": [
        {"gpu": 0, "fit": True, "checks": []},
        {"gpu": 1, "fit": False, "checks": [{"check": "ecc_uncorrectable"}, {"check": "gpu_reset\u001b]0;x\u0007"}]},
    ],
}


def compact(document: object) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


class Hostile(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _head(self, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def do_GET(self) -> None:
        mode = self.path.strip("/")
        try:
            if mode in ("fit", "unfit", "truncated", "array"):
                body = {
                    "fit": compact(FIT),
                    "unfit": compact(UNFIT),
                    "truncated": compact(FIT)[:40],  # '{"node":"n","taken_at":1.0,"fit":true,"u'
                    "array": b"[]",
                }[mode]
                self._head(len(body))
                self.wfile.write(body)
            elif mode == "endless":  # 600 MB announced and sent as fast as it is taken
                self._head(600 * 1024 * 1024)
                self.wfile.write(b'{"fit":true,"unfit_gpus":[],"pad":"')
                chunk = b"a" * 65536
                while True:
                    self.wfile.write(chunk)
            elif mode == "endless-unannounced":  # no length, connection close at the end (never)
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"fit":true,"unfit_gpus":[],"pad":"')
                while True:
                    self.wfile.write(b"a" * 65536)
            elif mode == "trickle":
                self._head(10_000)
                self.wfile.write(b'{"fit":true,')
                for _ in range(120):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def tool_dir(tmp_path: Path, parser: str) -> Path:
    """A PATH with coreutils, curl and one parser only (as an NPD image with python3, or with jq)."""
    folder = tmp_path / f"bin-{parser}"
    folder.mkdir(exist_ok=True)
    for name in ("sh", "timeout", "head", "mktemp", "wc", "rm", "curl", parser):
        found = require_tool(name) if name in ("curl", "jq") else shutil.which(name)
        if name == "python3":
            found = sys.executable
        assert found, name
        target = folder / name
        if not target.exists():
            target.symlink_to(found)
    return folder


def run_check(url: str, path: Path) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """The script's result, how long it ran, and the peak RSS (KiB) of it and its children."""
    probe = (
        "import resource, subprocess, sys, json\n"
        "r = subprocess.run(['sh', sys.argv[1]], capture_output=True, text=True, env=json.loads(sys.argv[2]))\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([r.returncode, r.stdout, r.stderr, peak]))\n"
    )
    env = {"PATH": str(path), "AMDGPU_HEALTH_URL": url, "AMDGPU_HEALTH_TIMEOUT": "3"}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", probe, str(SCRIPT), json.dumps(env)], capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    code, stdout, stderr, rss = json.loads(out.stdout)
    return subprocess.CompletedProcess(["sh", str(SCRIPT)], code, stdout, stderr), elapsed, rss


@pytest.mark.parametrize("parser", ["python3", "jq"])
def test_the_check_fails_closed_on_anything_but_a_whole_document(server: str, tmp_path: Path, parser: str) -> None:
    path = tool_dir(tmp_path, parser)
    result, _, _ = run_check(f"{server}/fit", path)
    assert (result.returncode, result.stdout) == (0, "every AMD GPU on the node is fit\n"), result
    result, _, _ = run_check(f"{server}/unfit", path)
    assert result.returncode == 1
    # the check name with a terminal escape in it is not echoed into NPD's condition message
    assert result.stdout == "AMD GPU(s) not fit: gpu 1; failing checks: ecc_uncorrectable\n"
    for mode in ("truncated", "array", "nothing-here"):
        result, _, _ = run_check(f"{server}/{mode}", path)
        assert result.returncode == 2, (mode, result)
    result, _, _ = run_check("http://127.0.0.1:9/api/v1/health", path)  # nobody listens
    assert result.returncode == 2 and "did not answer" in result.stdout


@pytest.mark.parametrize("mode", ["endless", "endless-unannounced", "trickle"])
def test_the_check_is_bounded_in_time_and_memory(server: str, tmp_path: Path, mode: str) -> None:
    result, elapsed, rss_kib = run_check(f"{server}/{mode}", tool_dir(tmp_path, "python3"))
    assert result.returncode == 2, result
    assert len(result.stdout) <= 400
    assert elapsed < 15, f"{mode}: ran {elapsed:.1f} s with AMDGPU_HEALTH_TIMEOUT=3"
    assert rss_kib < 100 * 1024, f"{mode}: peak RSS {rss_kib} KiB"


def test_the_check_reads_the_real_daemons_verdict(tmp_path: Path) -> None:
    process, port = start_exporter("--demo", "--demo.fleet=1xMI210", "--interval=0.25s")
    try:
        wait_ready(port, process)
        for parser in ("python3", "jq"):
            result, _, _ = run_check(f"http://127.0.0.1:{port}/api/v1/health", tool_dir(tmp_path, parser))
            assert result.returncode == 0, (parser, result)
    finally:
        stop(process)
    assert os.path.exists(SCRIPT)
