"""--web.config.file end to end: the daemon as a process, spoken to by curl, openssl s_client and a
real Prometheus; TLS, mTLS, basic auth, rate limit, live edits, header limits, idle connections,
start-up errors, IPv6 and systemd socket activation."""

from __future__ import annotations

import base64
import os
import resource
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import harness
from tests.harness import EXPORTER, Daemon, free_port, stop
from tests.realtools import require_tool
from tests.webtls import Pki, bcrypt_hash, make_pki, write_web_config

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-scrape"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def password_hash() -> str:
    return bcrypt_hash(PASSWORD)


def start_daemon(
    folder: Path, *args: str, web: dict | None = None, wrapper: tuple[str, ...] = (), port: int | None = None
) -> Daemon:
    """The demo daemon (not yet ready: TLS and auth need their client); web: its --web.config.file."""
    folder.mkdir(parents=True, exist_ok=True)
    extra = [f"--web.config.file={write_web_config(folder / 'web.yml', web)}"] if web is not None else []
    return harness.start_daemon(
        folder, "--demo", "--interval=0.5s", *args, *extra, ready=False, wrapper=wrapper, port=port
    )


def wait_ready(daemon: Daemon, client: httpx.Client, base: str) -> None:
    harness.wait_until(
        lambda: client.get(f"{base}/readyz", timeout=2).status_code == 200,
        f"{base}/readyz: {daemon.stderr()[-2000:]}",
        process=daemon.process,
    )


def curl(*args: str) -> tuple[int, str, str]:
    """(exit code, HTTP status or '000', body)."""
    done = subprocess.run(
        [require_tool("curl"), "-sS", "--max-time", "10", "-w", "\n%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    body, _, status = done.stdout.rpartition("\n")
    return done.returncode, status, body


def s_client(port: int, *args: str, request: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [require_tool("openssl"), "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost", *args],
        input=request,
        capture_output=True,
        timeout=30,
        check=False,
    )


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


# --- TLS + basic auth ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki, password_hash: str) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("tls")
    web = {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "basic_auth_users": {"prom": password_hash},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "deny"}},
    }
    daemon = start_daemon(folder, web=web)
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=pki.ca), auth=("prom", PASSWORD)) as client:
            wait_ready(daemon, client, f"https://127.0.0.1:{daemon.port}")
        yield daemon
    finally:
        stop(daemon.process)


def test_curl_with_the_ca_and_password_gets_metrics(tls_daemon: Daemon, pki: Pki) -> None:
    url = f"https://127.0.0.1:{tls_daemon.port}/metrics"
    code, status, body = curl("--cacert", str(pki.ca), "-u", f"prom:{PASSWORD}", "-D", "/dev/stderr", url)
    assert (code, status) == (0, "200")
    assert [v for _, v in series(body, "amdgpu_up")] == [1.0] * 8
    done = subprocess.run(
        [
            require_tool("curl"),
            "-sS",
            "-o",
            "/dev/null",
            "-D",
            "-",
            "--cacert",
            str(pki.ca),
            "-u",
            f"prom:{PASSWORD}",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    headers = done.stdout.lower()
    assert "x-content-type-options: nosniff" in headers and "x-frame-options: deny" in headers
    assert "server:" not in headers


def test_wrong_or_missing_password_is_401(tls_daemon: Daemon, pki: Pki) -> None:
    url = f"https://127.0.0.1:{tls_daemon.port}/metrics"
    for auth in (["-u", "prom:wrong"], ["-u", f"nobody:{PASSWORD}"], []):
        code, status, body = curl("--cacert", str(pki.ca), *auth, url)
        assert (code, status) == (0, "401"), auth
        assert "amdgpu_" not in body
    done = subprocess.run(
        [require_tool("curl"), "-sS", "-o", "/dev/null", "-D", "-", "--cacert", str(pki.ca), url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert 'www-authenticate: basic realm="amdgpu-exporter"' in done.stdout.lower()
    # every path is protected but the two probes (Kubernetes' httpGet probes cannot do basic auth)
    for path in ("/api/v1/devices", "/api/v1/alerts", "/", "/nothing-here"):
        assert curl("--cacert", str(pki.ca), f"https://127.0.0.1:{tls_daemon.port}{path}")[1] == "401", path
    for path in ("/healthz", "/readyz"):
        code, status, body = curl("--cacert", str(pki.ca), f"https://127.0.0.1:{tls_daemon.port}{path}")
        assert status == "200" and body.strip() in ("ok", "ready"), path


def test_plain_http_and_an_unknown_ca_get_no_metrics(tls_daemon: Daemon, pki: Pki) -> None:
    code, _status, body = curl("-u", f"prom:{PASSWORD}", f"http://127.0.0.1:{tls_daemon.port}/metrics")
    assert code != 0 and "amdgpu_" not in body
    code, _, body = curl("-u", f"prom:{PASSWORD}", f"https://127.0.0.1:{tls_daemon.port}/metrics")
    assert code == 60 and "amdgpu_" not in body  # certificate not trusted


def test_openssl_s_client_verifies_and_speaks_tls12_and_13_only(tls_daemon: Daemon, pki: Pki) -> None:
    request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: %s\r\n\r\n" % basic(
        "prom", PASSWORD
    )
    done = s_client(tls_daemon.port, "-CAfile", str(pki.ca), "-verify_return_error", "-ign_eof", request=request)
    out = done.stdout.decode(errors="replace")
    assert "Verify return code: 0 (ok)" in out
    assert "HTTP/1.1 200 OK" in out and "amdgpu_up{" in out
    for version in ("-tls1_3", "-tls1_2"):
        assert s_client(tls_daemon.port, "-CAfile", str(pki.ca), version).returncode == 0
    refused = s_client(tls_daemon.port, "-CAfile", str(pki.ca), "-tls1_1")
    assert refused.returncode != 0


def test_nothing_served_leaks_paths_or_docs(tls_daemon: Daemon, pki: Pki) -> None:
    base = f"https://127.0.0.1:{tls_daemon.port}"
    auth = ("--cacert", str(pki.ca), "-u", f"prom:{PASSWORD}")
    for path in ("/api/docs", "/openapi.json", "/docs", "/etc/passwd", "/metrics/../x"):
        _code, status, body = curl(*auth, base + path)
        assert status == "404" and body.strip() == "not found", path
    _, _, metrics = curl(*auth, base + "/metrics")
    [(labels, _)] = series(metrics, "amdgpu_exporter_build_info")
    assert labels["source_reason"] == "auto_sysfs_root_not_sys"
    _, _, landing = curl(*auth, base + "/")
    assert "/dev/shm" not in landing and "/tmp" not in landing and "cdn" not in landing.lower()


def test_oversized_or_too_many_headers_are_431(tls_daemon: Daemon, pki: Pki) -> None:
    auth = ("--cacert", str(pki.ca), "-u", f"prom:{PASSWORD}")
    url = f"https://127.0.0.1:{tls_daemon.port}/metrics"
    assert curl(*auth, "-H", "X-Big: " + "a" * 20000, url)[1] == "431"
    many = [arg for i in range(150) for arg in ("-H", f"X-N{i}: 1")]
    assert curl(*auth, *many, url)[1] == "431"
    assert curl(*auth, "-H", "X-Fine: " + "a" * 2000, url)[1] == "200"


# --- mTLS ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtls_daemon(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("mtls")
    web = {
        "tls_server_config": {
            "cert_file": str(pki.server_cert),
            "key_file": str(pki.server_key),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki.ca),
            "client_allowed_sans": ["prometheus.example"],
        }
    }
    daemon = start_daemon(folder, web=web)
    try:
        context = ssl.create_default_context(cafile=pki.ca)
        context.load_cert_chain(pki.client_cert, pki.client_key)
        with httpx.Client(verify=context) as client:
            wait_ready(daemon, client, f"https://127.0.0.1:{daemon.port}")
        yield daemon
    finally:
        stop(daemon.process)


def test_mtls_with_and_without_a_client_certificate(mtls_daemon: Daemon, pki: Pki) -> None:
    url = f"https://127.0.0.1:{mtls_daemon.port}/metrics"
    ca = ("--cacert", str(pki.ca))
    code, status, body = curl(*ca, "--cert", str(pki.client_cert), "--key", str(pki.client_key), url)
    assert (code, status) == (0, "200") and "amdgpu_up{" in body
    for cert, key in ((None, None), (pki.other_cert, pki.other_key), (pki.rogue_cert, pki.rogue_key)):
        extra = ("--cert", str(cert), "--key", str(key)) if cert else ()
        code, status, body = curl(*ca, *extra, url)
        assert code != 0 and status == "000" and "amdgpu_" not in body, cert
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    good = s_client(mtls_daemon.port, "-CAfile", str(pki.ca), "-cert", str(pki.client_cert), "-key",
                    str(pki.client_key), "-ign_eof", request=request)  # fmt: skip
    assert b"HTTP/1.1 200 OK" in good.stdout
    bare = s_client(mtls_daemon.port, "-CAfile", str(pki.ca), "-ign_eof", request=request)
    assert b"HTTP/1.1 200" not in bare.stdout
    assert b"certificate required" in bare.stderr or bare.returncode != 0


# --- rate limit, live edits ------------------------------------------------------------------------


def test_rate_limit_answers_429(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, web={"rate_limit": {"interval": "1m", "burst": 3}})
    try:
        deadline = time.monotonic() + 30
        while curl(f"http://127.0.0.1:{daemon.port}/readyz")[1] != "200":  # probes take no token
            assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.stderr()
            time.sleep(0.2)
        statuses = [curl(f"http://127.0.0.1:{daemon.port}/metrics")[1] for _ in range(5)]
        assert statuses == ["200", "200", "200", "429", "429"]
        assert curl(f"http://127.0.0.1:{daemon.port}/healthz")[1] == "200"
        done = subprocess.run(
            [require_tool("curl"), "-sS", "-D", "-", "-o", "/dev/null", f"http://127.0.0.1:{daemon.port}/metrics"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert "retry-after:" in done.stdout.lower()
    finally:
        stop(daemon.process)
    assert '"reason": "rate_limited"' in daemon.stderr()


def test_config_edited_while_running(tmp_path: Path, password_hash: str) -> None:
    daemon = start_daemon(tmp_path, web={"basic_auth_users": {"prom": password_hash}})
    url = f"http://127.0.0.1:{daemon.port}/metrics"
    try:
        with httpx.Client(auth=("prom", PASSWORD)) as client:
            wait_ready(daemon, client, f"http://127.0.0.1:{daemon.port}")
        assert curl("-u", f"prom:{PASSWORD}", url)[1] == "200"
        write_web_config(tmp_path / "web.yml", {"basic_auth_users": {"grafana": bcrypt_hash("new-one")}})

        def until(predicate: object, what: str) -> None:
            deadline = time.monotonic() + 10
            while not predicate():  # type: ignore[operator]
                assert time.monotonic() < deadline, what
                time.sleep(0.2)

        until(lambda: curl("-u", "grafana:new-one", url)[1] == "200", "the new user never got in")
        assert curl("-u", f"prom:{PASSWORD}", url)[1] == "401"

        def reloads() -> tuple[dict[str, float], float, float]:
            """(reloads by result, last reload successful, last poll time) as /metrics shows them."""
            _code, status, body = curl("-u", "grafana:new-one", url)
            assert status == "200"  # the last good configuration stays in effect
            counts = {
                labels["result"]: v
                for labels, v in series(body, "amdgpu_exporter_reloads_total")
                if labels["what"] == "web_config"
            }
            last_ok = series(body, "amdgpu_exporter_web_config_last_reload_successful")[0][1]
            return counts, last_ok, series(body, "amdgpu_exporter_last_poll_timestamp_seconds")[0][1]

        # an invalid edit: the last good configuration stays, one log line, one count
        (tmp_path / "web.yml").write_text("basic_auth_users:\n  grafana: new-one-in-plain-text\n")
        until(lambda: reloads()[:2] == ({"success": 1.0, "failure": 1.0}, 0.0), "the invalid edit was not counted")
        # the same invalid content again is not counted again: the reloader looks at most once a
        # second, so a request a second after the touch is one that sees it
        (tmp_path / "web.yml").touch()
        time.sleep(1.0)
        seen_at = time.time()
        curl("-u", "grafana:new-one", url)
        until(lambda: reloads()[2] > seen_at, "no poll cycle published after the touch was seen")
        assert reloads()[:2] == ({"success": 1.0, "failure": 1.0}, 0.0)
    finally:
        stop(daemon.process)
    log = daemon.stderr()
    assert log.count("web_config_reload_failed") == 1
    assert "new-one-in-plain-text" not in log and "Traceback" not in log


# --- start-up errors -----------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXPORTER, "--demo", *args], capture_output=True, text=True, timeout=60, check=False)


def test_startup_errors_are_one_clear_line(tmp_path: Path, pki: Pki) -> None:
    def config(data: object) -> str:
        path = tmp_path / f"web-{len(list(tmp_path.iterdir()))}.yml"
        path.write_text(data if isinstance(data, str) else __import__("yaml").safe_dump(data))
        return str(path)

    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    cases = {
        str(tmp_path / "missing.yml"): "cannot read it: No such file or directory",
        config("tls_server_config: [\n"): "not valid YAML",
        config({"tls_server_config": {**tls, "key_file": str(pki.client_key)}}): "does not match",
        config({"tls_server_config": {**tls, "key_file": str(tmp_path)}}): "not a regular file",
        config({"tls_server_config": {**tls, "cert_file": str(tmp_path / "nope.crt")}}): "nope.crt: cannot read it",
        config({"tls_server_config": {**tls, "client_ca_file": str(pki.ca)}}): "NoClientCert",
        config({"basic_auth_users": {"prom": "plain"}}): "not a bcrypt hash",
    }
    # Each case is its own daemon start (~1 CPU-s of imports before the error): all at once, as the
    # machine has cores; each is checked on its own below.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {
            path: pool.submit(run_cli, f"--web.config.file={path}", f"--web.listen-address=127.0.0.1:{free_port()}")
            for path in cases
        }
        socket_activation = pool.submit(run_cli, "--web.systemd-socket")
    for path, needle in cases.items():
        done = runs[path].result()
        assert done.returncode == 2, (needle, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("amdgpu-exporter: error: --web.config.file ")
    done = socket_activation.result()
    assert done.returncode == 2 and "LISTEN_FDS" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# --- hardening: idle connections, trickling headers, an endless header ---------------------------


def _metrics(port: int) -> str:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    response.raise_for_status()
    return response.text


def test_2000_idle_connections_leave_scrapes_and_polling_unaffected(tmp_path: Path) -> None:
    """At systemd's default of 1024 open files (soft = hard here, so it cannot be raised)."""
    prlimit = require_tool("prlimit")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    daemon = start_daemon(tmp_path, wrapper=(prlimit, "--nofile=1024:1024", "--"))
    port = daemon.port
    idle: list[socket.socket] = []
    try:
        with httpx.Client() as client:
            wait_ready(daemon, client, f"http://127.0.0.1:{port}")
        before = series(_metrics(port), "amdgpu_exporter_last_poll_timestamp_seconds")[0][1]
        for _ in range(2000):
            sock = socket.create_connection(("127.0.0.1", port))
            idle.append(sock)
        trickler = socket.create_connection(("127.0.0.1", port))
        trickler.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for _ in range(20):  # each answered: a server stalled by the idle connections would time out
            text = _metrics(port)
            assert [v for _, v in series(text, "amdgpu_up")] == [1.0] * 8
            time.sleep(0.1)
        after = series(_metrics(port), "amdgpu_exporter_last_poll_timestamp_seconds")[0][1]
        assert after - before >= 1.0, "polling stalled"
        open_fds = len(os.listdir(f"/proc/{daemon.process.pid}/fd"))
        assert open_fds < 1024 - 100, open_fds
        # idle and trickling connections are closed at the header timeout (10 s from the first byte)
        trickler.settimeout(1)
        answer = b""
        while time.monotonic() - started < 30:
            try:
                trickler.send(b"X")
                answer = trickler.recv(200)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                pass
            break
        closed_after = time.monotonic() - started
        assert 9 < closed_after < 25, closed_after  # not before the timeout; late only on a busy machine
        assert answer.startswith(b"HTTP/1.1 408") or answer == b""
        time.sleep(1)
        closed = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed == len(idle), f"{len(idle) - closed} idle connections still open"
        text = _metrics(port)
        rejections = {labels["reason"]: v for labels, v in series(text, "amdgpu_exporter_http_rejections_total")}
        assert [v for _, v in series(text, "amdgpu_up")] == [1.0] * 8
        assert not rejections  # no web config: counters only with --web.config.file
    finally:
        for sock in idle:
            sock.close()
        stop(daemon.process)
    log = daemon.stderr()
    assert "Traceback" not in log
    assert log.count("http_connection_evicted") <= 10  # rate-limited


def test_2000_idle_tls_connections_leave_tls_scrapes_unaffected(tmp_path: Path, pki: Pki) -> None:
    """Connections that never start a handshake, and others that finish one and then idle."""
    prlimit = require_tool("prlimit")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    web = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}}
    daemon = start_daemon(tmp_path, web=web, wrapper=(prlimit, "--nofile=1024:1024", "--"))
    context = ssl.create_default_context(cafile=pki.ca)
    idle: list[socket.socket] = []
    try:
        with httpx.Client(verify=context) as client:
            base = f"https://127.0.0.1:{daemon.port}"
            wait_ready(daemon, client, base)
            for _ in range(1700):
                idle.append(socket.create_connection(("127.0.0.1", daemon.port)))
            for _ in range(300):
                raw = socket.create_connection(("127.0.0.1", daemon.port))
                idle.append(context.wrap_socket(raw, server_hostname="localhost"))
            for _ in range(20):  # each answered: curl gives up on a stalled server (--max-time 10)
                _code, status, body = curl("--cacert", str(pki.ca), f"{base}/metrics")
                assert status == "200" and [v for _, v in series(body, "amdgpu_up")] == [1.0] * 8
            assert len(os.listdir(f"/proc/{daemon.process.pid}/fd")) < 1024 - 100
    finally:
        for sock in idle:
            sock.close()
        stop(daemon.process)
    assert "Traceback" not in daemon.stderr()


def test_an_endless_header_costs_neither_memory_nor_polling(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        with httpx.Client() as client:
            wait_ready(daemon, client, f"http://127.0.0.1:{daemon.port}")
        rss_before = _rss(daemon.process.pid)
        cpu_before = _cpu(daemon.process.pid)
        wall_before = time.monotonic()
        sock = socket.create_connection(("127.0.0.1", daemon.port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        sent = 0
        chunk = b"a" * 65536
        try:
            while sent < 100 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert sent < 10 * 1024 * 1024, "the server kept reading an endless header"
        assert _rss(daemon.process.pid) - rss_before < 20 * 1024 * 1024
        # the poll loop's own CPU over the same time is a few percent of a core
        assert _cpu(daemon.process.pid) - cpu_before < 0.5 + 0.2 * (time.monotonic() - wall_before)
        assert [v for _, v in series(_metrics(daemon.port), "amdgpu_up")] == [1.0] * 8
    finally:
        stop(daemon.process)
    assert '"reason": "header_too_large"' in daemon.stderr()


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# --- listeners -----------------------------------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_repeatable_and_ipv6_listen_addresses(tmp_path: Path) -> None:
    if not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    port4, port6 = free_port(), free_port()
    daemon = start_daemon(tmp_path, f"--web.listen-address=127.0.0.1:{port4}", f"--web.listen-address=[::1]:{port6}")
    try:
        with httpx.Client() as client:
            wait_ready(daemon, client, f"http://127.0.0.1:{port4}")
        assert curl(f"http://127.0.0.1:{port4}/healthz")[1] == "200"
        assert curl("-g", f"http://[::1]:{port6}/healthz")[1] == "200"
    finally:
        stop(daemon.process)


def test_systemd_socket_activation(tmp_path: Path, pki: Pki) -> None:
    activate = require_tool("systemd-socket-activate")
    port = free_port()
    web = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}}
    daemon = start_daemon(
        tmp_path,
        "--web.systemd-socket",
        web=web,
        # it passes on no environment unless asked: PYTHONPATH picks the code under test
        wrapper=(activate, "-E", "PYTHONPATH", "-l", f"127.0.0.1:{port}"),
        port=port,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the first connection starts the exporter (socket activation)
            code, status, body = curl("--cacert", str(pki.ca), f"https://127.0.0.1:{port}/metrics")
            if status == "200":
                break
            assert time.monotonic() < deadline, (code, status, daemon.stderr())
            time.sleep(0.3)
        assert "amdgpu_up{" in body
    finally:
        stop(daemon.process)
    assert '"listening"' in daemon.stderr()


# --- a real Prometheus over TLS with basic auth ---------------------------------------------------


def test_prometheus_scrapes_over_tls_with_basic_auth(tls_daemon: Daemon, pki: Pki, tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    (tmp_path / "password").write_text(PASSWORD)
    (tmp_path / "prometheus.yml").write_text(
        __import__("yaml").safe_dump(
            {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "amdgpu",
                        "scheme": "https",
                        "tls_config": {"ca_file": str(pki.ca), "server_name": "localhost"},
                        "basic_auth": {"username": "prom", "password_file": str(tmp_path / "password")},
                        "static_configs": [{"targets": [f"127.0.0.1:{tls_daemon.port}"]}],
                    }
                ],
            }
        )
    )
    port = free_port()
    process = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        result: list = []
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/query", params={"query": 'up{job="amdgpu"}'}, timeout=2
                ).json()
                result = answer["data"]["result"]
                if result and result[0]["value"][1] == "1":
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        assert result and result[0]["value"][1] == "1", result
        gpus = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/query", params={"query": 'count(amdgpu_up{job="amdgpu"} == 1)'}, timeout=2
        ).json()["data"]["result"]
        assert gpus and gpus[0]["value"][1] == "8"
    finally:
        stop(process)


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("Linux only")


# --- garbage on the wire, and its log --------------------------------------------------------------


def test_garbage_requests_are_answered_and_logged_rate_limited(tmp_path: Path) -> None:
    import random

    daemon = start_daemon(tmp_path)
    rng = random.Random(14)
    blobs = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),  # a TLS ClientHello on the plain port
        b"GET /\x00 HTTP/1.1\r\n\r\n",
    ]
    blobs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400))) for _ in range(300)]
    try:
        with httpx.Client() as client:
            wait_ready(daemon, client, f"http://127.0.0.1:{daemon.port}")
        for blob in blobs:
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as sock:
                sock.sendall(blob)
                sock.shutdown(socket.SHUT_WR)
                try:
                    answer = sock.recv(100)
                except (ConnectionResetError, TimeoutError):
                    answer = b""
                assert answer == b"" or answer.startswith(b"HTTP/1.1 "), (blob[:40], answer)
        assert [v for _, v in series(_metrics(daemon.port), "amdgpu_up")] == [1.0] * 8
    finally:
        stop(daemon.process)
    log = daemon.stderr().splitlines()
    assert all(line.startswith("{") for line in log), [line for line in log if not line.startswith("{")][:3]
    bad = [line for line in log if '"http_bad_request"' in line]
    assert 1 <= len(bad) <= 10, len(bad)  # rate-limited: a few lines, then a count of the suppressed
    assert "Traceback" not in daemon.stderr()


def test_socket_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    analyze = require_tool("systemd-analyze")
    units = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
    text = (units / "amdgpu-exporter.socket").read_text()
    assert "ListenStream=9442" in text and "Service=amdgpu-exporter.service" in text
    done = subprocess.run(
        [analyze, "verify", str(units / "amdgpu-exporter.socket")], capture_output=True, text=True, timeout=60
    )
    problems = [line for line in done.stderr.splitlines() if "amdgpu-exporter.socket" in line]
    assert done.returncode == 0 or not problems, done.stderr
    assert not problems, problems


def test_a_rotated_certificate_and_a_new_client_auth_apply_without_restart(tmp_path: Path, pki: Pki) -> None:
    from tests.webtls import _leaf

    folder = tmp_path / "tls"
    folder.mkdir()
    for name in ("ca.crt", "ca.key"):
        (folder / name).write_bytes((pki.folder / name).read_bytes())
    _leaf(folder, "rotated", "/CN=rotated.example", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    cert, key = folder / "live.crt", folder / "live.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    tls = {"cert_file": str(cert), "key_file": str(key)}
    daemon = start_daemon(tmp_path, web={"tls_server_config": tls})
    url = f"https://127.0.0.1:{daemon.port}/healthz"

    def subject() -> str:
        done = s_client(daemon.port, "-CAfile", str(pki.ca))
        return next((line for line in done.stdout.decode().splitlines() if line.startswith("subject=")), "")

    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=pki.ca)) as client:
            wait_ready(daemon, client, f"https://127.0.0.1:{daemon.port}")
        assert "CN = localhost" in subject()
        # cert-manager style rotation: new files in place, the YAML untouched
        key.write_bytes((folder / "rotated.key").read_bytes())
        cert.write_bytes((folder / "rotated.crt").read_bytes())
        deadline = time.monotonic() + 10
        while "rotated.example" not in subject():
            assert time.monotonic() < deadline, subject()
            time.sleep(0.3)
        # client certificates become optional-but-verified
        write_web_config(
            tmp_path / "web.yml",
            {
                "tls_server_config": {
                    **tls,
                    "client_auth_type": "VerifyClientCertIfGiven",
                    "client_ca_file": str(pki.ca),
                }
            },
        )
        deadline = time.monotonic() + 10
        while curl("--cacert", str(pki.ca), "--cert", str(pki.rogue_cert), "--key", str(pki.rogue_key), url)[0] == 0:
            assert time.monotonic() < deadline, "a certificate from another CA is still accepted"
            time.sleep(0.3)
        assert curl("--cacert", str(pki.ca), url)[1] == "200"  # no certificate: fine
        good = ("--cert", str(pki.client_cert), "--key", str(pki.client_key))
        assert curl("--cacert", str(pki.ca), *good, url)[1] == "200"
    finally:
        stop(daemon.process)
    assert daemon.stderr().count("web_config_reloaded") >= 2


def test_sigterm_with_idle_and_handshaking_connections_exits_promptly(tmp_path: Path, pki: Pki) -> None:
    web = {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}}
    daemon = start_daemon(tmp_path, web=web)
    context = ssl.create_default_context(cafile=pki.ca)
    held: list[socket.socket] = []
    try:
        with httpx.Client(verify=context) as client:
            wait_ready(daemon, client, f"https://127.0.0.1:{daemon.port}")
        held += [socket.create_connection(("127.0.0.1", daemon.port)) for _ in range(50)]  # never handshake
        for _ in range(20):  # handshake, then idle
            held.append(
                context.wrap_socket(socket.create_connection(("127.0.0.1", daemon.port)), server_hostname="localhost")
            )
        time.sleep(0.5)
        started = time.monotonic()
        daemon.process.terminate()
        assert daemon.process.wait(10) == 0
        assert time.monotonic() - started < 5.0  # not held open by the connections' 10 s timeouts
    finally:
        for sock in held:
            sock.close()
        stop(daemon.process)
    assert "Traceback" not in daemon.stderr()
