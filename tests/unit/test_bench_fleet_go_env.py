"""bench.fleet's --go-gc / --go-memory-limit: what Go would read, or a clear error before any run."""

from __future__ import annotations

import pytest

from bench import fleet


def test_no_setting_is_gos_defaults() -> None:
    assert fleet.go_environment("", "") == {}
    assert fleet.go_settings({}) == "Go's defaults (GOGC=100, no GOMEMLIMIT)"


def test_both_settings_reach_the_environment() -> None:
    env = fleet.go_environment("50", "3500MiB")
    assert env == {"GOGC": "50", "GOMEMLIMIT": "3500MiB"}
    assert fleet.go_settings(env) == "GOGC=50, GOMEMLIMIT=3500MiB"


@pytest.mark.parametrize(("gogc", "limit", "flag"), [("fifty", "", "--go-gc"), ("", "3.5GB", "--go-memory-limit")])
def test_a_value_go_would_ignore_is_refused(gogc: str, limit: str, flag: str) -> None:
    message = fleet.go_environment(gogc, limit)
    assert isinstance(message, str) and message.startswith(flag)


def test_main_refuses_a_bad_value_without_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet.main(["--nodes", "1", "--go-memory-limit", "lots", "--output", ""]) == 2
    assert "--go-memory-limit 'lots'" in capsys.readouterr().err
