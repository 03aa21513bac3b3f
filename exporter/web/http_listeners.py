"""Listening sockets handed over by systemd (--web.systemd-socket, sd_listen_fds(3) protocol)."""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

SD_LISTEN_FDS_START = 3


class ListenError(RuntimeError):
    """No usable socket; the message is one sentence for the operator."""


def systemd_sockets(environ: MutableMapping[str, str] | None = None) -> list[socket.socket]:
    """The stream sockets systemd passed to this process (LISTEN_FDS/LISTEN_PID), which it then forgets."""
    environ = os.environ if environ is None else environ
    count_text = environ.get("LISTEN_FDS", "")
    if not count_text or environ.get("LISTEN_PID", "") != str(os.getpid()):
        raise ListenError(
            "--web.systemd-socket: systemd passed no sockets to this process (LISTEN_FDS/LISTEN_PID); "
            "start it through amdgpu-exporter.socket or drop the flag"
        )
    if not (count_text.isascii() and count_text.isdigit()) or int(count_text) < 1:
        raise ListenError(f"--web.systemd-socket: LISTEN_FDS={count_text!r} is not a positive count")
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count_text)):
        try:
            sock = socket.socket(fileno=fd)
        except OSError as error:
            raise ListenError(f"--web.systemd-socket: descriptor {fd} is not a socket ({error.strerror})") from None
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ListenError(f"--web.systemd-socket: descriptor {fd} is not a listening stream socket")
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
