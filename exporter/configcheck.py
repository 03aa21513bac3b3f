"""Checking and re-reading configuration: `check-config`, `check-rules` and SIGHUP.

A config file is read here into nodes (not just loaded) so every error names its line, and each
value is parsed by the same Option the daemon uses (config.OPTIONS), so what `check-config` accepts
is exactly what `serve` accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from exporter.alerting.rulefile import load_rules, rules_of
from exporter.config import (
    OPTION_BY_NAME,
    OPTIONS,
    ConfigError,
    Option,
    Settings,
    collector_options,
    no_flags,
    read_config_values,
    resolve,
    unknown_environment,
)
from exporter.exposition.metrics import METRICS
from exporter.exposition.selection import ExpositionOptions, Selection, exposition_options, selection_of
from exporter.log import configure_logging
from exporter.web.webconfig_reload import WebConfigReloader

# What a reload applies at once; every other option needs a restart (the listener, the source, ...).
RELOADABLE = (
    "rules.file",
    "log.level",
    "collectors.include",
    "collectors.exclude",
    "families.include",
    "families.exclude",
    "window.all-series",
    "metrics.identity-labels",
    "attribution.series-labels",
)


def read_config_file(path: str) -> dict[str, Any]:
    """Option name -> parsed value, for every option the file sets; ConfigError naming file and line.

    Read by config.read_config_values, the reader `serve` uses, and each value parsed by the same
    Option: what `check-config` and a reload accept is exactly what start-up accepts.
    """
    return {name: _parse(OPTION_BY_NAME[name], raw, line) for name, (raw, line) in read_config_values(path).items()}


def _parse(option: Option, raw: Any, line: str) -> Any:
    try:
        return option.value(raw)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{line}: {option.name}: {error}") from error


def reload_settings(settings: Settings) -> Settings:
    """The settings with the config file read again. Flags and environment variables still win, as
    at start; an option the file no longer sets goes back to its default."""
    from_file = read_config_file(settings.config_file) if settings.config_file else {}
    changes: dict[str, Any] = {}
    origins = dict(settings.origins)
    for option in OPTIONS:
        if origins.get(option.name) in ("flag", "env"):
            continue
        if option.name in from_file:
            changes[option.dest], origins[option.name] = from_file[option.name], "file"
        else:
            changes[option.dest], origins[option.name] = _parse(option, option.default, option.name), "default"
    merged = {option.dest: changes.get(option.dest, getattr(settings, option.dest)) for option in OPTIONS}
    warnings = collector_options(merged, origins)  # the collector switches into the include lists, as at start
    return dataclasses.replace(settings, **merged, origins=origins, warnings=warnings)


def exposition_of(settings: Settings) -> ExpositionOptions:
    """What /metrics renders under these settings; ConfigError naming a collector or family glob that
    matches nothing (with the nearest name), as start-up, check-config and SIGHUP say it."""
    try:
        return exposition_options(settings)
    except ValueError as error:
        raise ConfigError(str(error)) from error


def changed_options(before: Settings, after: Settings) -> list[str]:
    return [option.name for option in OPTIONS if getattr(before, option.dest) != getattr(after, option.dest)]


def check_rules(path: str) -> str:
    """`check-rules FILE`: the one-line summary, or RulesConfigError with the line."""
    rules = load_rules(Path(path))
    names = ", ".join(rule.alert for rule in rules[:5]) + (", ..." if len(rules) > 5 else "")
    overrides = sum(len(rule.asic_overrides) for rule in rules)
    with_overrides = f", {overrides} ASIC override(s)" if overrides else ""
    return f"{path}: OK, {len(rules)} rule(s){with_overrides}: {names}"


def check_config(path: str, environ: Mapping[str, str]) -> str:
    """`check-config FILE`: the one-line summary. Checked as `serve --config.file FILE` would start
    with this environment: every value (its line named), the rule file, the web config file and the
    files it names, and that each listen address's host can be bound here (on a free port: a running
    daemon's port is not in the way)."""
    values = read_config_file(path)  # first: its errors name the line
    try:
        return f"{path}: OK, {len(values)} option(s)" + _check_settings(
            resolve(no_flags(), {**environ, "AMDGPU_EXPORTER_CONFIG_FILE": path})
        )
    except ConfigError as error:
        raise ConfigError(f"config file {path}: {error}") from error


def _check_settings(settings: Settings) -> str:
    families = exposition_of(settings).families
    rules = rules_of(settings)
    summary = f"; rules.file {settings.rules_file}: {len(rules)} rule(s)" if settings.rules_file else ""
    if selection_of(settings) != Selection():
        summary += f"; {len(families)} of {len(METRICS)} metric families rendered"
    if settings.web_config_file:
        web = WebConfigReloader(settings.web_config_file).load()
        tls, users = "on" if web.ssl_context else "off", len(web.config.basic_auth_users)
        summary += f"; web.config.file {settings.web_config_file}: TLS {tls}, {users} user(s)"
    for host, port in () if settings.web_systemd_socket else settings.web_listen_address:
        try:
            socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET).close()
        except OSError as error:
            reason = os.strerror(error.errno) if error.errno else str(error)
            raise ConfigError(f"web.listen-address {host}:{port}: cannot listen on {host}: {reason}") from error
    return summary


def check_main(command: str, argv: list[str]) -> int:
    """`amdgpu-exporter check-config FILE` / `check-rules FILE`: exit 0 with a summary line, 1 with
    the error (file and line) on stderr, 2 for a wrong command line."""
    what = "config file" if command == "check-config" else "rule file"
    parser = argparse.ArgumentParser(prog=f"amdgpu-exporter {command}", description=f"Check a {what}.")
    parser.add_argument("file", metavar="FILE", help=f"the {what} to check")
    args = parser.parse_args(argv)
    configure_logging("error", "console")  # the summary line is the output, not the loaders' info lines
    try:
        if command == "check-config":
            for warning in unknown_environment(os.environ):
                print(f"amdgpu-exporter: warning: {warning}", file=sys.stderr)
        print(check_config(args.file, os.environ) if command == "check-config" else check_rules(args.file))
    except ConfigError as error:  # RulesConfigError is one
        print(f"amdgpu-exporter: error: {error}", file=sys.stderr)
        return 1
    return 0
