"""The --web.* flags of issue 14: repeatable IPv6-capable listen addresses, web config, sockets, cap."""

from __future__ import annotations

import argparse
import os
import socket

import pytest

from exporter.config import ConfigError, add_arguments, resolve
from exporter.sources.base import StartupError
from exporter.web.http_server import shown_address, systemd_sockets


def _resolve(argv: list[str], env: dict[str, str] | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(argv), env or {})


def test_web_defaults() -> None:
    s = _resolve([])
    assert s.web_listen_address == (("0.0.0.0", 9442),)
    assert s.web_config_file == "" and s.web_systemd_socket is False and s.web_max_connections == 512


def test_listen_address_repeats_and_takes_ipv6() -> None:
    s = _resolve(["--web.listen-address", "127.0.0.1:9442", "--web.listen-address", "[::]:9442"])
    assert s.web_listen_address == (("127.0.0.1", 9442), ("::", 9442))
    s = _resolve([], {"AMDGPU_EXPORTER_WEB_LISTEN_ADDRESS": "[::1]:1,10.0.0.1:2"})
    assert s.web_listen_address == (("::1", 1), ("10.0.0.1", 2))


def test_web_flags() -> None:
    s = _resolve(["--web.config.file", "/etc/web.yml", "--web.systemd-socket", "--web.max-connections", "64"])
    assert (s.web_config_file, s.web_systemd_socket, s.web_max_connections) == ("/etc/web.yml", True, 64)
    for bad in ("0", "-3", "many"):
        with pytest.raises(ConfigError, match=r"--web\.max-connections"):
            _resolve(["--web.max-connections", bad])


def test_systemd_sockets_takes_what_systemd_passed() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    spare = os.dup(3) if _fd_open(3) else None
    try:
        os.dup2(listener.fileno(), 3)
        env = {"LISTEN_FDS": "1", "LISTEN_PID": str(os.getpid()), "LISTEN_FDNAMES": "web"}
        [sock] = systemd_sockets(env)
        assert shown_address(sock) == f"127.0.0.1:{listener.getsockname()[1]}"
        assert "LISTEN_FDS" not in env and "LISTEN_PID" not in env  # not passed on to children
        sock.detach()
    finally:
        if spare is not None:
            os.dup2(spare, 3)
            os.close(spare)
        else:
            os.close(3)
        listener.close()


def test_systemd_sockets_refuses_foreign_or_missing_descriptors() -> None:
    with pytest.raises(StartupError, match="LISTEN_FDS"):
        systemd_sockets({})
    with pytest.raises(StartupError, match="LISTEN_FDS"):
        systemd_sockets({"LISTEN_FDS": "1", "LISTEN_PID": "1"})  # meant for another process


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
