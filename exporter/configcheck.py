"""Checking and re-reading configuration: `check-config`, `check-rules` and SIGHUP.

A config file is read here into nodes (not just loaded) so every error names its line, and each
value is parsed by the same Option the daemon uses (config.OPTIONS), so what `check-config` accepts
is exactly what `serve` accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from exporter.alerting.rulefile import RulesConfigError, load_rules
from exporter.config import OPTION_BY_NAME, OPTIONS, ConfigError, Option, Settings, read_config_values

# What a reload applies at once; every other option needs a restart (the listener, the source, ...).
RELOADABLE = ("rules.file", "log.level")


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
    return dataclasses.replace(settings, **changes, origins=origins)


def changed_options(before: Settings, after: Settings) -> list[str]:
    return [option.name for option in OPTIONS if getattr(before, option.dest) != getattr(after, option.dest)]


def check_rules(path: str) -> str:
    """`check-rules FILE`: the one-line summary, or RulesConfigError with the line."""
    rules = load_rules(Path(path))
    names = ", ".join(rule.alert for rule in rules[:5]) + (", ..." if len(rules) > 5 else "")
    overrides = sum(len(rule.asic_overrides) for rule in rules)
    with_overrides = f", {overrides} ASIC override(s)" if overrides else ""
    return f"{path}: OK, {len(rules)} rule(s){with_overrides}: {names}"


def check_config(path: str) -> str:
    """`check-config FILE`: the one-line summary; the rule file it names is checked too."""
    values = read_config_file(path)
    summary = f"{path}: OK, {len(values)} option(s)"
    rules_file = values.get("rules.file")
    if rules_file:
        try:
            rules = load_rules(Path(rules_file))
        except RulesConfigError as error:
            raise ConfigError(f"config file {path}: rules.file: {error}") from error
        summary += f"; rules.file {rules_file}: {len(rules)} rule(s)"
    return summary


def check_main(command: str, argv: list[str]) -> int:
    """`amdgpu-exporter check-config FILE` / `check-rules FILE`: exit 0 with a summary line, 1 with
    the error (file and line) on stderr, 2 for a wrong command line."""
    what = "config file" if command == "check-config" else "rule file"
    parser = argparse.ArgumentParser(prog=f"amdgpu-exporter {command}", description=f"Check a {what}.")
    parser.add_argument("file", metavar="FILE", help=f"the {what} to check")
    args = parser.parse_args(argv)
    try:
        print(check_config(args.file) if command == "check-config" else check_rules(args.file))
    except ConfigError as error:  # RulesConfigError is one
        print(f"amdgpu-exporter: error: {error}", file=sys.stderr)
        return 1
    return 0
