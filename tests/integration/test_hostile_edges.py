"""Inputs the daemon does not control, made hostile, against the real daemon as a process: live edits
of the web configuration, anonymous clients flooding basic auth, user probing by timing, broken
Alertmanagers (huge, compressed and trickling replies), non-ASCII numbers and garbage requests."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import statistics
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import yaml

from exporter.attribution import slurm
from tests.harness import BROKEN_RUN, EXPORTER, free_port, stop, wait_until
from tests.integration.test_web_security import PASSWORD, Daemon, basic, series, start_daemon, wait_ready
from tests.webtls import Pki, bcrypt_hash, make_pki, write_web_config

pytestmark = pytest.mark.integration


def wait_for(condition: Callable[[], bool], what: str, daemon: Daemon, timeout: float = BROKEN_RUN) -> None:
    try:
        wait_until(condition, what, timeout, process=daemon.process, step=0.1)
    except AssertionError as error:
        raise AssertionError(f"{error}: {daemon.stderr()[-3000:]}") from None


def reload_failures(client: httpx.Client, base: str) -> float:
    text = client.get(f"{base}/metrics", headers={"authorization": basic("prom", PASSWORD).decode()}).text
    return sum(
        v
        for labels, v in series(text, "amdgpu_exporter_reloads_total")
        if labels["what"] == "web_config" and labels["result"] == "failure"
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_auth_daemon(tmp_path: Path, pki: Pki) -> Iterator[tuple[Daemon, httpx.Client, str, Path]]:
    web = {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "basic_auth_users": {"prom": bcrypt_hash(PASSWORD, rounds=4)},
    }
    daemon = start_daemon(tmp_path, web=web)
    client = httpx.Client(verify=str(pki.ca), timeout=10)
    base = f"https://localhost:{daemon.port}"
    try:
        wait_ready(daemon, client, base)
        yield daemon, client, base, tmp_path / "web.yml"
    finally:
        client.close()
        stop(daemon.process)


def test_no_live_web_config_edit_ends_the_daemon_or_turns_auth_off(
    tls_auth_daemon: tuple[Daemon, httpx.Client, str, Path], pki: Pki
) -> None:
    daemon, client, base, web_file = tls_auth_daemon
    cert, key = pki.server_cert.read_text(), pki.server_key.read_text()
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    users = {"prom": bcrypt_hash(PASSWORD, rounds=4)}
    hostile = [
        "[" * 5000,  # deeper than any parser's stack
        yaml.safe_dump(
            {"tls_server_config": {**tls, "cert_file": str(pki.server_cert) + "\0x"}, "basic_auth_users": users}
        ),
        "",  # an editor that truncates before it writes
        yaml.safe_dump({"tls_server_config": tls, "basic_auth_users": {}}),  # users emptied
        yaml.safe_dump({"tls_server_config": tls}),  # users removed
        yaml.safe_dump({"basic_auth_users": users}),  # TLS removed
    ]
    failures = reload_failures(client, base)
    for number, text in enumerate(hostile, 1):
        web_file.write_bytes(text.encode())
        wait_for(lambda n=failures: reload_failures(client, base) > n, f"edit {number} counted as failed", daemon)
        failures = reload_failures(client, base)
        assert client.get(f"{base}/metrics").status_code == 401, f"edit {number} turned authentication off"
    log = daemon.stderr()
    assert "Traceback" not in log
    assert "turning basic authentication off needs a restart" in log
    # Inline PEM loads from memory: an unwritable TMPDIR is no reason to refuse it.
    inline = {
        "tls_server_config": {"cert": cert, "key": key},
        "basic_auth_users": {"prom": bcrypt_hash(PASSWORD, rounds=4)},
    }
    write_web_config(web_file, inline)
    wait_for(lambda: "web_config_reloaded" in daemon.stderr(), "the inline certificate to load", daemon)
    assert client.get(f"{base}/metrics", headers={"authorization": basic("prom", PASSWORD).decode()}).status_code == 200


def test_start_up_with_a_hostile_web_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = {"deep.yml": "[" * 5000, "fifo.yml": None}
    for name, text in cases.items():
        path = tmp_path / name
        if text is None:
            os.mkfifo(path)  # a hung or hostile mount standing where the file should be
        else:
            path.write_text(text)
        # it must refuse to start: run to its exit, never waited for as a listener
        done = subprocess.run(
            [EXPORTER, "--demo", f"--web.config.file={path}", f"--web.listen-address=127.0.0.1:{free_port()}"],
            capture_output=True,
            text=True,
            timeout=BROKEN_RUN,
        )
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and str(path) in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _local_client(address: str, timeout: float) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=timeout)


def test_anonymous_clients_cannot_lock_the_scraper_out(tmp_path: Path) -> None:
    """32 anonymous clients (each from its own loopback address) flood a freshly started daemon, whose
    cache of verified credentials is empty; the real scraper is answered every time, within 2 s."""
    daemon = start_daemon(tmp_path, web={"basic_auth_users": {"prom": bcrypt_hash(PASSWORD, rounds=10)}})
    base = f"http://127.0.0.1:{daemon.port}"
    stop_flood = threading.Event()
    anonymous_answers: list[int] = []

    def flood(index: int) -> None:
        with _local_client(f"127.0.0.{index + 2}", 10) as client:
            while not stop_flood.is_set():
                try:
                    answer = client.get(f"{base}/metrics", headers={"authorization": basic("nobody", "x").decode()})
                    anonymous_answers.append(answer.status_code)
                except httpx.HTTPError:
                    pass

    try:
        with httpx.Client(timeout=10) as probe:
            wait_ready(daemon, probe, base)
        with ThreadPoolExecutor(32) as pool, _local_client("127.0.0.1", 10) as scraper:
            for index in range(32):
                pool.submit(flood, index)
            while len(anonymous_answers) < 64:  # the flood is under way
                time.sleep(0.05)
            latencies = []
            for _ in range(8):
                started = time.monotonic()
                answer = scraper.get(f"{base}/metrics", headers={"authorization": basic("prom", PASSWORD).decode()})
                latencies.append(time.monotonic() - started)
                assert answer.status_code == 200, (answer.status_code, answer.text)
                time.sleep(0.3)
            stop_flood.set()
        assert max(latencies) < 2.0, latencies
        assert 401 in anonymous_answers
    finally:
        stop_flood.set()
        stop(daemon.process)


def test_a_wrong_user_takes_as_long_as_a_wrong_password(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, web={"basic_auth_users": {"prom": bcrypt_hash(PASSWORD, rounds=12)}})
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        with httpx.Client(timeout=30) as client:
            wait_ready(daemon, client, base)

            def median_seconds(user: str) -> float:
                times = []
                for _ in range(5):
                    started = time.monotonic()
                    answer = client.get(f"{base}/metrics", headers={"authorization": basic(user, "wrong").decode()})
                    times.append(time.monotonic() - started)
                    assert answer.status_code == 401
                return statistics.median(times)

            known, unknown = median_seconds("prom"), median_seconds("nobody")
        assert 0.5 < unknown / known < 2.0, (known, unknown)
    finally:
        stop(daemon.process)


# --- Alertmanagers that misbehave ---------------------------------------------------------------

_BOMB = zlib.compressobj(9, zlib.DEFLATED, 31)
GZIP_BOMB = b"".join(_BOMB.compress(bytes(1 << 20)) for _ in range(256)) + _BOMB.flush()  # 256 MiB of zeros


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "huge"
    posts: ClassVar[list[float]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).posts.append(time.monotonic())
        try:
            if self.mode == "huge":
                self.send_response(500)
                self.send_header("content-length", str(400 << 20))
                self.end_headers()
                chunk = b"x" * (1 << 20)
                for _ in range(400):
                    self.wfile.write(chunk)
            elif self.mode == "bomb":
                self.send_response(500)
                self.send_header("content-encoding", "gzip")
                self.send_header("content-length", str(len(GZIP_BOMB)))
                self.end_headers()
                self.wfile.write(GZIP_BOMB)
            else:  # trickle: one byte every second, for longer than any post may take
                self.send_response(200)
                self.send_header("content-length", "120")
                self.end_headers()
                for _ in range(120):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(1)
        except OSError:
            pass  # the exporter hung up: what it should do


def _fake_alertmanager(mode: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = type(f"Handler_{mode}", (_Handler,), {"mode": mode, "posts": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _status_bytes(pid: int, field: str) -> int:
    """A size from /proc/<pid>/status ("VmRSS", "VmSize"), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def test_broken_alertmanagers_cost_a_counter_not_memory_or_a_stuck_sender(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(
        "rules:\n  - alert: AlwaysHot\n    metric: temperature_celsius\n    sensor: edge\n    comparison: '>'\n"
        "    threshold: 1\n    for: 1s\n    severity: warning\n"
    )
    servers = {mode: _fake_alertmanager(mode) for mode in ("huge", "bomb", "trickle")}
    urls = [f"--alertmanager.url={url}" for _server, url in servers.values()]
    daemon = start_daemon(tmp_path, f"--rules.file={rules}", *urls)
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        with httpx.Client(timeout=10) as client:
            wait_ready(daemon, client, base)

            def failed() -> float:
                text = client.get(f"{base}/metrics").text
                found = series(text, "amdgpu_exporter_alertmanager_notifications_total")
                return sum(v for labels, v in found if labels["result"] == "failed")

            # Each endpoint is posted to, fails, and is posted to again (retried on its schedule):
            # the trickling one within its deadline, not never.
            wait_for(
                lambda: all(len(server.RequestHandlerClass.posts) >= 2 for server, _ in servers.values()),  # type: ignore[attr-defined]
                "every Alertmanager to be posted to twice",
                daemon,
                timeout=40,
            )
            assert failed() > 0
            assert _status_bytes(daemon.process.pid, "VmRSS") < 250 << 20
        log = daemon.stderr()
        assert "Traceback" not in log
        assert "no complete answer within" in log  # the trickle, named
    finally:
        stop(daemon.process)
        for server, _url in servers.values():
            server.shutdown()


# --- the API and the HTTP layer ----------------------------------------------------------------


def test_non_ascii_numbers_and_garbage_requests_are_answered_and_logged_without_tracebacks(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--fast.interval=100ms")
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        with httpx.Client(timeout=10) as client:
            wait_ready(daemon, client, base)
            for query in ("gpu=%C2%B2", "gpu=%D9%A1", "gpu=0&seconds=%D9%A1", "gpu=0&seconds=%EF%BC%91"):
                answer = client.get(f"{base}/api/v1/waveform?{query}")
                assert answer.status_code == 400, (query, answer.status_code, answer.text)
                assert ("gpu=" in answer.text) or ("seconds=" in answer.text)
        for garbage in (b"GET /\x00 HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"GET / HTTP/9\r\n\r\n"):
            for _ in range(20):
                with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as raw:
                    raw.sendall(garbage)
                    raw.settimeout(5)
                    with contextlib.suppress(OSError):
                        raw.recv(1024)
        # A request pipelined behind an Upgrade: the first is answered and the connection closed
        # (never left waiting), so the client sends the second again on a new connection.
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as raw:
            raw.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            received = b""
            while chunk := raw.recv(4096):  # ends at EOF; a hang would raise socket.timeout
                received += chunk
            assert received.startswith(b"HTTP/1.1 200") and b"connection: close" in received.lower()
        time.sleep(0.5)  # the log lines of the last requests are written after their answers
        log = daemon.stderr()
        assert "Traceback" not in log
        assert len(log.splitlines()) < 200, "protocol errors are logged rate-limited"
    finally:
        stop(daemon.process)


# --- Slurm state: planted links and directories, foreign bytes, a FIFO standing for a file ---------

SLURM = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def _slurm_script(script: str, state: Path, job: str, gpus: str = "0", **extra: bytes) -> str:
    env: dict[bytes, bytes] = {
        b"PATH": b"/usr/sbin:/usr/bin:/sbin:/bin",
        b"SLURM_JOB_ID": job.encode(),
        b"SLURM_JOB_USER": b"alice",
        b"SLURM_JOB_PARTITION": b"mi250",
        b"SLURM_JOB_GPUS": gpus.encode(),
        b"AMDGPU_EXPORTER_SLURM_STATE_DIR": str(state).encode(),
    }
    env.update({key.encode(): value for key, value in extra.items()})
    done = subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr  # a failing prolog or epilog drains the node
    return done.stderr.decode(errors="replace")


def test_the_prolog_follows_no_planted_link_or_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(victim)
    assert "symbolic link" in _slurm_script("prolog.sh", linked, "7")
    state = tmp_path / "state"
    state.mkdir()
    (state / "0.7").symlink_to(victim)  # a link where the record goes
    (state / "1.7").mkdir()  # a directory where the record goes
    _slurm_script("prolog.sh", state, "7", gpus="0,1")
    assert list(victim.iterdir()) == [] and list((state / "1.7").iterdir()) == []
    assert (state / "0.7").is_file() and not (state / "0.7").is_symlink()  # the link itself was replaced
    _slurm_script("epilog.sh", state, "7")
    assert not (state / "0.7").exists()


def test_a_job_with_foreign_bytes_keeps_its_labels(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _slurm_script("prolog.sh", state, "8", SLURM_JOB_PARTITION=b"p\xff\xfe")
    record = (state / "0.8").read_bytes()
    assert json.loads(record.decode("utf-8"))["SLURM_JOB_PARTITION"] == "p\ufffd\ufffd"
    (state / "1.9").write_bytes(b'{"SLURM_JOB_ID": "9", "SLURM_JOB_USER": "b\xe9a"}')  # another writer's bytes
    claims = {
        claim.device_id: dict(claim.labels) for claim in slurm.claims_from_files(slurm.read_state_files(str(state)))
    }
    assert claims["0"]["job_partition"] == "p\ufffd\ufffd" and claims["1"]["job_user"] == "b\ufffda"


def test_a_fifo_in_the_state_dir_holds_nothing_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _slurm_script("prolog.sh", state, "101", gpus="0")
    os.mkfifo(state / "1.102")  # stands for a hung or hard-mounted file: opening it would block
    daemon = start_daemon(tmp_path / "daemon", f"--slurm.state-dir={state}")
    base = f"http://127.0.0.1:{daemon.port}"
    try:
        with httpx.Client(timeout=10) as client:
            wait_ready(daemon, client, base)

            def jobs() -> set[str]:
                text = client.get(f"{base}/metrics").text
                return {labels["job_id"] for labels, _ in series(text, "amdgpu_job_info")}

            def slurm_up() -> float:
                text = client.get(f"{base}/metrics").text
                found = series(text, "amdgpu_exporter_attribution_up")
                return next(v for labels, v in found if labels["source"] == "slurm")

            wait_for(lambda: jobs() == {"101"}, "job 101's labels", daemon)
            _slurm_script("epilog.sh", state, "101")
            wait_for(lambda: jobs() == set(), "the departed job's labels to go", daemon)
            assert slurm_up() == 1.0
        daemon.process.terminate()
        assert daemon.process.wait(10) == 0  # nothing stuck on the FIFO holds the exit back
    finally:
        stop(daemon.process)


# --- running out of address space ----------------------------------------------------------------


def test_running_out_of_address_space_is_survived_and_recovered_from(tmp_path: Path) -> None:
    """RLIMIT_AS lowered to what the running daemon already uses: no new thread, arena or mapping can
    be made. The daemon must live through it and be whole again once the limit is raised."""
    prlimit = shutil.which("prlimit")
    assert prlimit is not None, "prlimit (util-linux) is needed"
    daemon = start_daemon(tmp_path, "--fast.interval=100ms", "--read-timeout=500ms")
    base = f"http://127.0.0.1:{daemon.port}"
    pid = daemon.process.pid
    try:
        with httpx.Client(timeout=10) as client:
            wait_ready(daemon, client, base)
            assert (
                _status_bytes(pid, "VmSize") < 512 << 20
            )  # a 60 MB daemon does not reserve a gigabyte of address space
            squeezed = _status_bytes(pid, "VmSize") + (1 << 20)
            subprocess.run([prlimit, f"--pid={pid}", f"--as={squeezed}:unlimited"], check=True, timeout=10)
            time.sleep(3)  # cycles, scrapes and sampler reads under the limit
            for _ in range(3):
                with contextlib.suppress(httpx.HTTPError):
                    client.get(f"{base}/metrics")
            assert daemon.process.poll() is None, daemon.stderr()[-3000:]
            subprocess.run([prlimit, f"--pid={pid}", "--as=unlimited:unlimited"], check=True, timeout=10)

            def whole() -> bool:
                answer = client.get(f"{base}/metrics")
                ups = [v for _labels, v in series(answer.text, "amdgpu_up")] if answer.status_code == 200 else []
                ready = client.get(f"{base}/readyz").status_code == 200
                return ready and len(ups) == 8 and all(v == 1.0 for v in ups)

            wait_for(whole, "every device up and the daemon ready again", daemon)
    finally:
        stop(daemon.process)
