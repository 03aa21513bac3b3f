"""The HTTP server: uvicorn's httptools protocol with limits, a connection cap and TLS per connection.

Why not uvicorn as it comes: it accepts any header size and count (httptools accumulates a
header value by concatenation, so one endless header costs memory and quadratic CPU), never
closes a connection that sends nothing, and accepts connections until the process runs out of
file descriptors, after which device reads fail too. Here:

* the request line and headers are limited in bytes (431) and in count (431), and must arrive
  within a header timeout (408); a response must be taken within a response timeout;
* every connection holds a slot in a ConnectionTable whose size comes from the file budget;
  when it is full a new connection evicts the oldest one that is not in the middle of a request,
  so idle or trickling clients cannot lock scrapes out, and the descriptors the poller needs
  are never taken;
* TLS is set up per connection with the SSLContext of the current web configuration, so a
  reloaded certificate applies to the next connection, and a handshake counts against the cap.

The listening sockets are opened by the daemon or handed over by systemd (--web.systemd-socket,
the sd_listen_fds(3) protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import ssl
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from exporter.sources.base import StartupError
from exporter.sources.sysfs.files import KEPT_PER_DEVICE
from exporter.web.http_log import HttpStats
from exporter.web.webconfig_reload import ActiveWebConfig
from exporter.web.webconfig_tls import san_allowed


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024  # request line + headers; Prometheus sends ~300 bytes
    max_headers: int = 100
    header_timeout: float = 10.0  # from connect (or a keep-alive request's first byte) to the blank line
    response_timeout: float = 60.0  # a request in progress, including a client slow to read
    idle_timeout: float = 90.0  # keep-alive between requests: longer than common scrape intervals
    tls_handshake_timeout: float = 10.0
    max_connections: int = 512


def raise_nofile_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit (systemd leaves the soft one at 1024); (soft, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


# Descriptors a device can hold beside its kept files: the slow layer's and pcie_bw's reads, the
# fast sampler's table (kept open by the sampler), and one more while a hung read is outstanding.
_TRANSIENT_PER_DEVICE = 8


def connection_budget(requested: int, soft_limit: int, in_use: int, devices: int) -> int:
    """Connections that fit beside what the process needs: per device its every-cycle files kept
    open (sources/sysfs/files.py, at most KEPT_PER_DEVICE) and a few read at once, plus logs,
    listeners and the rocm-smi worker."""
    reserve = 64 + (KEPT_PER_DEVICE + _TRANSIENT_PER_DEVICE) * devices
    return max(4, min(requested, soft_limit - in_use - reserve))


class Slot:
    """A connection's place in the table: its phase, since when, and how to close it."""

    __slots__ = ("close", "phase", "since")

    def __init__(self, close: Callable[[str], None], phase: str) -> None:
        self.close = close  # close(reason)
        self.phase = phase  # handshake | waiting | reading | busy | idle
        self.since = time.monotonic()

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.since = time.monotonic()


class ConnectionTable:
    def __init__(self, limits: HttpLimits, stats: HttpStats) -> None:
        self.limits = limits
        self.stats = stats
        self.slots: dict[int, Slot] = {}
        stats.max_connections = limits.max_connections

    def admit(self, slot: Slot) -> bool:
        if len(self.slots) >= self.limits.max_connections:
            victim = next((s for s in self.slots.values() if s.phase != "busy"), None)
            if victim is None:
                self.stats.reject(
                    "connection_limit", "http_connection_refused", reason="connection_limit", open=len(self.slots)
                )
                return False
            self.release(victim)
            self.stats.reject("idle_evicted", "http_connection_evicted", reason="connection_limit", phase=victim.phase)
            victim.close("idle_evicted")
        self.slots[id(slot)] = slot
        self.stats.open_connections = len(self.slots)
        return True

    def release(self, slot: Slot) -> None:
        if self.slots.pop(id(slot), None) is not None:
            self.stats.open_connections = len(self.slots)

    def sweep(self) -> None:
        """Close connections past their phase's deadline (called about once a second)."""
        now = time.monotonic()
        limits = self.limits
        deadline = {
            "handshake": limits.tls_handshake_timeout + 2.0,
            "waiting": limits.header_timeout,
            "reading": limits.header_timeout,
            "busy": limits.response_timeout,
            "idle": limits.idle_timeout + 2.0,
        }
        for slot in list(self.slots.values()):
            if now - slot.since > deadline[slot.phase]:
                reason = "response_timeout" if slot.phase == "busy" else "header_timeout"
                if slot.phase in ("waiting", "reading", "busy"):
                    self.stats.reject(reason, "http_connection_timed_out", reason=reason, phase=slot.phase)
                self.release(slot)
                slot.close(reason)


def _status_response(status: int, phrase: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n" % (status, phrase)
    return head + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body) + body


RESPONSE_431 = _status_response(431, b"Request Header Fields Too Large", b"request header fields too large\n")
RESPONSE_408 = _status_response(408, b"Request Timeout", b"request timeout\n")
RESPONSE_503 = _status_response(503, b"Service Unavailable", b"too many connections\n")


class _HeadersTooMany(Exception):
    pass


class GuardedHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with the limits above; holds one Slot of the ConnectionTable."""

    def __init__(self, *args: Any, table: ConnectionTable, slot: Slot | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.table = table
        self.limits = table.limits
        self.slot = slot
        self._connected = False
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        self._too_many = False

    # -- connection --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.slot is None:
            slot = Slot(self._close_slot, "waiting")
            if not self.table.admit(slot):
                transport.write(RESPONSE_503)
                transport.close()
                return
            self.slot = slot
        else:
            self.slot.close = self._close_slot
            self.slot.enter("waiting")
        self._connected = True
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._connected:
            return
        self._connected = False
        if self.slot is not None:
            self.table.release(self.slot)
        super().connection_lost(exc)

    def _close_slot(self, reason: str) -> None:
        if not self._connected or self.transport.is_closing():
            return
        if reason == "header_timeout" and self.slot is not None and self.slot.phase == "reading":
            self.transport.write(RESPONSE_408)
            self.transport.close()
        elif reason == "idle_evicted":
            self.transport.close()
        else:
            self.transport.abort()

    # -- reading -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if not self._connected:
            return
        slot = self.slot
        assert slot is not None
        if slot.phase in ("waiting", "idle"):
            slot.enter("reading")
        self._unset_keepalive_if_required()
        view = memoryview(data)
        while view:
            if self._in_head:
                room = self.limits.max_header_bytes - self._head_bytes
                if room <= 0:
                    self._refuse_431("header_too_large")
                    return
                piece, view = view[:room], view[room:]
                self._head_bytes += len(piece)
            else:
                piece, view = view, view[len(view) :]
            try:
                self.parser.feed_data(bytes(piece))
            except httptools.HttpParserUpgrade:
                # No upgrades (WebSocket, h2c) here: the request is answered as plain HTTP/1.1 and the
                # connection closed after it, since the parser reads nothing past an upgrade: a
                # request pipelined behind it would otherwise wait for an answer forever.
                if self.cycle is not None:
                    self.cycle.keep_alive = False
                return
            except httptools.HttpParserError as error:
                if self._too_many:
                    self._refuse_431("too_many_headers")
                    return
                self.table.stats.reject("bad_request", "http_bad_request", client=self._peer(), error=str(error)[:100])
                self.send_400_response("Invalid HTTP request received.")
                return
            if self.transport.is_closing():
                return

    def _peer(self) -> str:
        return str(self.client[0]) if self.client else ""

    def _refuse_431(self, reason: str) -> None:
        self.table.stats.reject(reason, "http_request_rejected", reason=reason, status=431, client=self._peer())
        self.transport.write(RESPONSE_431)
        self.transport.close()
        self.parser = None  # type: ignore[assignment]

    # -- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._in_head = True
        self._header_count = 0
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._too_many = True
            raise _HeadersTooMany
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        if self.slot is not None:
            self.slot.enter("busy")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.slot is not None and not self.pipeline and not self.transport.is_closing():
            self.slot.enter("idle")


class _EarlyEvents(asyncio.Protocol):
    """Holds what a TLS connection delivers between its handshake and the HTTP protocol taking over."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost: list[Exception | None] = []

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool | None:
        self.eof = True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def replay(self, protocol: asyncio.Protocol) -> None:
        for data in self.data:
            protocol.data_received(data)
        if self.eof:
            protocol.eof_received()
        for exc in self.lost:
            protocol.connection_lost(exc)


def _feed(protocol: Any, data: bytes) -> None:
    """Hand bytes to a protocol, buffered (get_buffer/buffer_updated) or not."""
    if not hasattr(protocol, "get_buffer"):
        protocol.data_received(data)
        return
    view = memoryview(data)
    while view:
        buffer = protocol.get_buffer(len(view))
        count = min(len(buffer), len(view))
        buffer[:count] = view[:count]
        protocol.buffer_updated(count)
        view = view[count:]


class TLSGate(asyncio.Protocol):
    """Accepts a TCP connection, takes a slot, does the handshake, then hands over to HTTP."""

    def __init__(self, server: GuardedServer) -> None:
        self.server = server
        self.slot: Slot | None = None
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.handed_over = False
        self.early: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        # uvloop may deliver the ClientHello although reading was paused in connection_made.
        self.early.append(data)

    def connection_made(self, transport: Any) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, hence Any.
        transport.pause_reading()
        self.transport = transport
        self.slot = Slot(self._close, "handshake")
        if not self.server.table.admit(self.slot):
            self.slot = None
            transport.abort()
            return
        self.task = asyncio.get_running_loop().create_task(self._upgrade(transport, self.slot))

    def _close(self, reason: str) -> None:
        if self.task is not None and not self.handed_over:
            self.task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # Only before start_tls took the transport over.
        if self.slot is not None and not self.handed_over:
            self.server.table.release(self.slot)
        if self.task is not None:
            self.task.cancel()

    async def _upgrade(self, raw: asyncio.Transport, slot: Slot) -> None:
        server = self.server
        active = server.current()
        peer = raw.get_extra_info("peername")
        client = str(peer[0]) if peer else ""
        early = _EarlyEvents()
        loop = asyncio.get_running_loop()
        handshake: asyncio.Future[Any] | None = None
        try:
            if active.ssl_context is None:
                raise ssl.SSLError("no TLS context")
            handshake = asyncio.ensure_future(
                loop.start_tls(
                    raw,
                    early,
                    active.ssl_context,
                    server_side=True,
                    ssl_handshake_timeout=server.limits.tls_handshake_timeout,
                )
            )
            await asyncio.sleep(0)  # start_tls has now put its TLS protocol on the transport
            if self.early:
                # Scheduled after start_tls's own connection_made/resume_reading callbacks.
                loop.call_soon(_feed, raw.get_protocol(), b"".join(self.early))
                self.early = []
            tls = await handshake
        except asyncio.CancelledError:
            if handshake is not None:
                handshake.cancel()
            server.table.release(slot)
            raw.abort()
            return
        except Exception as error:
            server.table.release(slot)
            reason = getattr(error, "reason", None) or type(error).__name__
            server.stats.reject("tls_handshake", "tls_handshake_failed", client=client, error=str(reason)[:100])
            raw.abort()
            return
        self.handed_over = True
        if tls is None:
            server.table.release(slot)
            return
        tls_config = active.config.tls
        if tls_config is not None and not san_allowed(tls_config, tls.get_extra_info("peercert")):
            server.table.release(slot)
            server.stats.reject(
                "client_cert_not_allowed", "http_connection_refused", reason="client_cert_not_allowed", client=client
            )
            tls.abort()
            return
        if early.lost:
            server.table.release(slot)
            return
        protocol = server.http_protocol(slot)
        tls.set_protocol(protocol)
        protocol.connection_made(tls)
        early.replay(protocol)


# How often the server looks at its Date header, idle connections and web config (uvicorn: every 10 x 0.1 s).
TICK_SECONDS = 1.0


class GuardedServer(uvicorn.Server):
    """uvicorn.Server whose listeners create GuardedHttpProtocol (and TLSGate when TLS is on)."""

    def __init__(
        self,
        config: uvicorn.Config,
        limits: HttpLimits,
        stats: HttpStats,
        current: Callable[[], ActiveWebConfig],
        tls: bool,
    ) -> None:
        super().__init__(config)
        self.limits = limits
        self.stats = stats
        self.current = current
        self.tls = tls
        self.table = ConnectionTable(limits, stats)
        self._exit_asked: asyncio.Event | None = None  # made by main_loop, on the running loop
        self._loop: asyncio.AbstractEventLoop | None = None

    def http_protocol(self, slot: Slot | None = None) -> GuardedHttpProtocol:
        return GuardedHttpProtocol(
            config=self.config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
            table=self.table,
            slot=slot,
        )

    def _new_connection(self) -> asyncio.Protocol:
        return TLSGate(self) if self.tls else self.http_protocol()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        loop = asyncio.get_running_loop()
        self.servers = []
        for sock in sockets or ():
            server = await loop.create_server(self._new_connection, sock=sock, backlog=self.config.backlog)
            self.servers.append(server)
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn only knows established HTTP connections: handshakes and connections that never
        # sent a byte would hold the listener's wait_closed (and so the exit) until a timeout.
        for slot in list(self.table.slots.values()):
            if slot.phase != "busy":
                self.table.release(slot)
                slot.close("shutdown")
        await super().shutdown(sockets)

    async def main_loop(self) -> None:
        """Once a second, what uvicorn does every tenth of its 0.1 s ticks (the Date header, the
        connection sweep, the web config's check); at once when asked to exit (exit(), a signal).

        uvicorn's own loop wakes ten times a second only to look at should_exit: about 1 ms/s of
        CPU on an otherwise idle daemon, for nothing that a wake-up on exit does not do.
        """
        self._loop = asyncio.get_running_loop()
        self._exit_asked = asyncio.Event()
        if self.should_exit:
            self._exit_asked.set()
        while not await self.on_tick(0):  # counter 0: every tick is a whole second's
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), TICK_SECONDS)

    def exit(self) -> None:
        """Stop serving (graceful: uvicorn's shutdown follows); safe from any thread."""
        self.should_exit = True
        self._wake()

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._wake()

    def _wake(self) -> None:
        loop, event = self._loop, self._exit_asked
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    async def on_tick(self, counter: int) -> bool:
        if counter % 10 == 0:  # uvicorn's ticks are 0.1 s; main_loop's are whole seconds
            self.table.sweep()
            self.current()  # an edit of the web config is checked (and a bad one logged) without traffic too
        return await super().on_tick(counter)


def uvicorn_config(app: Any, limits: HttpLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        # None: uvicorn must not re-apply its own logging config over route_library_logs(), which
        # would send every error, with its traceback, straight to stderr unthrottled.
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        server_header=False,
        proxy_headers=False,  # X-Forwarded-For is not trusted: the exporter is scraped directly
        timeout_keep_alive=int(limits.idle_timeout),
        http="httptools",
        ws="none",
    )


SD_LISTEN_FDS_START = 3


def systemd_sockets(environ: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The stream sockets systemd passed to this process (LISTEN_FDS/LISTEN_PID), which it then forgets."""
    environ = os.environ if environ is None else environ
    count_text = environ.get("LISTEN_FDS", "")
    if not count_text or environ.get("LISTEN_PID", "") != str(os.getpid()):
        raise StartupError(
            "--web.systemd-socket: systemd passed no sockets to this process (LISTEN_FDS/LISTEN_PID); "
            "start it through amdgpu-exporter.socket or drop the flag"
        )
    if not (count_text.isascii() and count_text.isdigit()) or int(count_text) < 1:
        raise StartupError(f"--web.systemd-socket: LISTEN_FDS={count_text!r} is not a positive count")
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count_text)):
        try:
            sock = socket.socket(fileno=fd)
        except OSError as error:
            raise StartupError(f"--web.systemd-socket: descriptor {fd} is not a socket ({error.strerror})") from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise StartupError(f"--web.systemd-socket: descriptor {fd} is not a listening stream socket")
        os.set_inheritable(fd, False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sockets.append(sock)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        environ.pop(name, None)
    return sockets


def shown_address(sock: socket.socket) -> str:
    """host:port of a listening socket, IPv6 in brackets."""
    address = sock.getsockname()
    if sock.family == socket.AF_INET6:
        return f"[{address[0]}]:{address[1]}"
    if sock.family == socket.AF_INET:
        return f"{address[0]}:{address[1]}"
    return str(address)
