"""`amdgpu-exporter`: serve (the default), snapshot, doctor, simulate, check-config FILE, check-rules FILE.

Every failure an operator can cause (a bad flag, a bad file, no GPU, a busy port) ends in one
sentence on stderr and a non-zero exit, never a traceback. Every flag is parsed and checked
before any device is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import sys
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, NoReturn

from exporter import __version__
from exporter.config import ConfigError, Settings, add_arguments, bounded_duration, resolve, unknown_environment
from exporter.exposition.selection import COLLECTOR_NAMES
from exporter.log import configure_logging, get_logger
from exporter.sources.base import StartupError

SUBCOMMANDS: dict[str, str] = {
    "serve": "serve /metrics, the JSON API and the status page (the default when no command is given)",
    "snapshot": "poll every device once (or --watch) and print a table, or the /api/v1/devices JSON",
    "doctor": "check kernel, driver, ROCm, firmware, PCIe links, environment and permissions",
    "simulate": "write a simulated amdgpu sysfs tree and keep it ticking (see simulate --help)",
    "check-config": "check a config file (and the rule file it names) without starting anything",
    "check-rules": "check an alert rule file without starting anything",
    "job-report": "what a job or pod used (energy, GPU time, peaks, errors): text, --json, --html",
}
_DESCRIPTIONS = {
    "serve": "Prometheus exporter for AMD Instinct GPUs (MI210, MI250X, MI300X).",
    "snapshot": "Poll every device once with the daemon's sources and print a table (or JSON).",
    "doctor": "The version matrix and the checks done by hand when a node misbehaves; exit 1 on any failure.",
}

# doctor's --path.NAME flags: (NAME, default, what the folder is)
_DOCTOR_PATHS = (
    ("procfs", "/proc", "folder standing for /proc"),
    ("dev", "/dev", "folder standing for /dev"),
    ("rocm", "/opt", "folder holding rocm* installs"),
)


class UsageError(Exception):
    """A command line argparse could not make sense of; the message is one sentence."""


class _Parser(argparse.ArgumentParser):
    """argparse, but every problem is one sentence naming the flag, and a typo gets a suggestion."""

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --interval: expected one argument": name the flag first, plainly.
        raise UsageError(message.removeprefix("argument "))

    def parse_checked(self, argv: Sequence[str]) -> argparse.Namespace:
        args, extra = self.parse_known_args(list(argv))
        if extra:
            unknown = extra[0]
            name = unknown.split("=", 1)[0]
            if not name.startswith("-"):
                raise UsageError(f"unexpected argument {unknown!r} (commands: {', '.join(SUBCOMMANDS)})")
            flags = [flag for action in self._actions for flag in action.option_strings if flag.startswith("--")]
            near = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else f"; see {self.prog} --help"
            raise UsageError(f"unknown flag {name}{hint}")
        return args


def _parser(command: str) -> _Parser:
    prog = "amdgpu-exporter" if command == "serve" else f"amdgpu-exporter {command}"
    description = _DESCRIPTIONS[command]
    usage = f"{prog} [FLAG ...]"
    if command == "serve":
        width = max(len(name) for name in SUBCOMMANDS)
        usage = f"{prog} [{'|'.join(SUBCOMMANDS)}] [FLAG ...]"
        description += "\n\ncommands:\n" + "\n".join(f"  {name:<{width}}  {text}" for name, text in SUBCOMMANDS.items())
        description += "\n\nRun 'amdgpu-exporter COMMAND --help' for a command's own flags."
    parser = _Parser(
        prog=prog,
        usage=usage,
        description=description,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"amdgpu-exporter {__version__}")
    if command == "snapshot":
        group = parser.add_argument_group("snapshot flags")
        group.add_argument(
            "--watch",
            metavar="DURATION",
            help="redraw every DURATION (e.g. 2s) until Ctrl-C, like watch(1) (100ms..24h)",
        )
        group.add_argument("--json", action="store_true", help="print the /api/v1/devices document (see docs/api.md)")
    if command == "doctor":
        group = parser.add_argument_group("doctor flags")
        group.add_argument("--json", action="store_true", help="print the findings as JSON")
        for name, default, what in _DOCTOR_PATHS:
            group.add_argument(
                f"--path.{name}",
                dest=f"path_{name}",
                default=default,
                metavar="PATH",
                help=f"{what} (default: {default})",
            )
    add_arguments(
        parser if command == "serve" else parser.add_argument_group("flags shared with serve"), COLLECTOR_NAMES
    )
    return parser


_WATCH = bounded_duration(0.1, 86400)


def _fail(message: str, code: int = 2) -> int:
    print(f"amdgpu-exporter: error: {message}", file=sys.stderr)
    return code


def _leave(code: int) -> NoReturn:
    """Exit now, without joining threads: a read stuck in a hung GPU's driver never returns, and
    Python joins executor threads at exit. Flush first: os._exit does not."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _finish(code: int) -> int:
    """Return normally unless a thread is stuck (in a hung device's read): then leave without it."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(timeout=0.2)
            if thread.is_alive():
                _leave(code)
    return code


def _configure_logging(settings: Settings, quiet_default: str) -> None:
    """Commands that print for a person (quiet_default "warn" or "error") log less unless --log.level
    says otherwise. Then a typo in an environment variable's name is a warning, not silently ignored."""
    level = settings.log_level if settings.origins.get("log.level") != "default" else quiet_default
    configure_logging(level, settings.log_format)
    for warning in unknown_environment(os.environ):
        get_logger("exporter.cli").warning("unknown_environment_variable", message=warning)
    for warning in settings.warnings:
        get_logger("exporter.cli").warning("deprecated_option", message=warning)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "serve"
    if argv and argv[0] in SUBCOMMANDS:
        argv = argv[1:]
    try:
        if command == "simulate":
            from exporter.simulator.__main__ import main as simulate_main

            return simulate_main(argv, prog="amdgpu-exporter simulate")
        if command == "job-report":
            from exporter.operator.job_report import run as job_report

            return job_report(argv)
        if command in ("check-config", "check-rules"):
            from exporter.configcheck import check_main

            return check_main(command, list(argv))
        args = _parser(command).parse_checked(argv)
        settings = resolve(args)
        if command == "snapshot":
            try:
                watch = _WATCH(args.watch) if args.watch is not None else None
            except ValueError as error:
                raise ConfigError(f"--watch: {error}") from error
            _configure_logging(settings, "warn")
            from exporter.operator import snapshot

            return _finish(snapshot.run(settings, watch=watch, as_json=args.json))
        if command == "doctor":
            _configure_logging(settings, "error")
            from exporter.operator import doctor

            return _finish(doctor.run(settings, args))
        _configure_logging(settings, settings.log_level)
        from exporter.daemon import serve

        _run_event_loop(serve(settings))
        _leave(0)
    except (ConfigError, UsageError, StartupError) as error:  # a bad rule file is a ConfigError too
        return _fail(str(error))
    except KeyboardInterrupt:
        _leave(130)


def _run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """uvloop where it is installed (a dependency; about twice the scrape throughput), else asyncio."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


if __name__ == "__main__":
    sys.exit(main())
