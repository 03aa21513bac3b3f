"""`amdgpu-exporter`: serve (the default), simulate, snapshot, check-config FILE, check-rules FILE.

Every failure an operator can cause (a bad flag, a bad file, no GPU, a busy port) ends in one
sentence on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from exporter import __version__
from exporter.config import ConfigError, Settings, add_arguments, resolve
from exporter.log import configure_logging

SUBCOMMANDS = ("serve", "simulate", "snapshot", "check-config", "check-rules")


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"amdgpu-exporter {__version__}")
    add_arguments(parser)
    return parser


def _settings(prog: str, description: str, argv: Sequence[str]) -> Settings:
    args = _parser(prog, description).parse_args(list(argv))
    return resolve(args)


def _fail(message: str, code: int = 2) -> int:
    print(f"amdgpu-exporter: error: {message}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "serve"
    if argv and argv[0] in SUBCOMMANDS:
        argv = argv[1:]
    try:
        if command == "simulate":
            from exporter.simulator.__main__ import main as simulate_main

            return simulate_main(argv, prog="amdgpu-exporter simulate")
        if command in ("check-config", "check-rules"):
            return _check(command, argv)
        if command == "snapshot":
            settings = _settings(
                "amdgpu-exporter snapshot", "Poll every device once and print the result as JSON.", argv
            )
            configure_logging(settings.log_level, "console" if settings.log_format == "auto" else settings.log_format)
            return _snapshot(settings)
        settings = _settings(
            "amdgpu-exporter", "Prometheus exporter for AMD Instinct GPUs (MI210, MI250X, MI300X).", argv
        )
        configure_logging(settings.log_level, settings.log_format)
        from exporter.daemon import serve

        _run_event_loop(serve(settings))
        # A read stuck in a hung GPU's driver never returns, and Python joins executor threads at
        # exit: leave now (after flushing) rather than hang until systemd's SIGKILL.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader that has gone must not change the exit
                stream.flush()
        os._exit(0)
    except ConfigError as error:
        return _fail(str(error))
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        from exporter.alerting.rulefile import RulesConfigError
        from exporter.daemon import StartupError

        if isinstance(error, StartupError | RulesConfigError):
            return _fail(str(error))
        raise


def _check(command: str, argv: Sequence[str]) -> int:
    from exporter.configcheck import check_main

    return check_main(command, list(argv))


def _run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop where it is installed (a dependency; about twice the scrape throughput), else asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def _snapshot(settings: Settings) -> int:
    from exporter.daemon import StartupError, select_source
    from exporter.pipeline.poller import Poller
    from exporter.web.routes import device_json

    async def run() -> int:
        source, name, _ = select_source(settings, settings.path_sysfs)
        poller = Poller(source, interval=settings.interval, read_timeout=settings.read_timeout, source_name=name)
        try:
            # A stuck read costs at most the read deadline (at discovery or in the one cycle): the
            # device is reported down, and the reader threads are daemon threads, never joined.
            found = await poller.discover_within(poller.discovery_deadline)
            if found is None:
                raise StartupError(
                    f"device discovery under {settings.path_sysfs} did not finish within "
                    f"{poller.discovery_deadline:g} s: a GPU or its driver may be hung (see dmesg)"
                )
            if not found:
                raise StartupError(f"no AMD GPU found under {settings.path_sysfs}/class/drm")
            snapshot = await poller.poll_once()
        finally:
            poller.close()
        print(json.dumps({"source": name, "devices": [device_json(d) for d in snapshot.devices]}, indent=2))
        return 0

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
