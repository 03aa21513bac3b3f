"""The oracle harness's own logic (no root, no chroot): comparison accounting, parsing, mirror lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracles import chroots
from tests.oracles.chroots import SID, TRIXIE, ChrootBuildError, chroot_key, debian_mirror
from tests.oracles.compare import Comparison, firmware_parser, flatten
from tests.oracles.runner import ToolOutputError, cpuinfo_without_hypervisor, parse_json_output
from tests.oracles.test_crosscheck_modern_tools import marketing_name_for


def test_flatten_keeps_units_beside_values() -> None:
    report = {"power": {"socket_power": {"value": 285, "unit": "W"}}, "vcn": ["N/A", 3]}
    assert flatten(report) == {"power.socket_power": 285, "power.socket_power@unit": "W", "vcn[0]": "N/A", "vcn[1]": 3}


def test_comparison_reports_a_mismatch_a_missing_series_and_an_unaccounted_value() -> None:
    c = Comparison("tool", "0000:01:00.0", {"a": "1", "b": "2", "c": "3", "d": "N/A", "e": "5"})
    c.check("a", 1.0)
    c.check("b", 3.0)
    c.check("c", None)
    c.check("d", 7.0)  # the tool does not report it: nothing to compare
    with pytest.raises(AssertionError) as failure:
        c.finish()
    message = str(failure.value)
    assert "b: tool '2' -> 2.0, ours 3.0" in message
    assert "c: tool reports '3', we export nothing" in message
    assert "neither compared nor listed as not exported: ['e']" in message
    assert "\n  d:" not in message


def test_comparison_passes_when_everything_is_accounted_for() -> None:
    c = Comparison("tool", "x", {"a": {"value": 1}, "temp": "40", "temp@unit": "C", "skip.me": "9"})
    c.values = flatten({"temp": {"value": 40, "unit": "C"}, "skip": {"me": 9}})
    c.check("temp", 40.0, unit="C")
    c.not_exported([r"skip\..*"])
    c.finish()


def test_comparison_checks_units() -> None:
    c = Comparison("tool", "x", flatten({"power": {"value": 5, "unit": "mW"}}))
    c.check("power", 5.0, unit="W")
    with pytest.raises(AssertionError, match="unit 'mW', expected 'W'"):
        c.finish()


def test_comparison_with_nothing_compared_fails() -> None:
    c = Comparison("tool", "x", {"a": "N/A"})
    c.check("a", 1.0)
    with pytest.raises(AssertionError, match="reported nothing we could compare"):
        c.finish()


@pytest.mark.parametrize(
    ("text", "base", "value"),
    [("0x0110101b", 16, 0x0110101B), ("27.00.01.22", 10, 0x1B000116), ("1B.00.01.16", 16, 0x1B000116), ("76", 10, 76)],
)
def test_firmware_versions_as_the_tools_print_them(text: str, base: int, value: int) -> None:
    assert firmware_parser(base)(text) == value


def test_marketing_name_families() -> None:
    assert marketing_name_for("AMD Instinct MI250X")("AMD Instinct MI250X / MI250") == "AMD Instinct MI250X"
    assert marketing_name_for("AMD Instinct MI250")("AMD Instinct MI250X / MI250") == "AMD Instinct MI250"
    assert marketing_name_for("AMD Instinct MI210")("AMD Instinct MI250X / MI250") != "AMD Instinct MI210"


def test_json_after_noise_lines() -> None:
    noisy = 'Fail to open libdrm_amdgpu.so: no such file\n{"card0": {"a": 1}}\n'
    assert parse_json_output(noisy) == {"card0": {"a": 1}}
    assert parse_json_output('[{"gpu": 0}]') == [{"gpu": 0}]
    with pytest.raises(ToolOutputError):
        parse_json_output("WARNING: nothing here {not json\n")


def test_cpuinfo_loses_only_the_hypervisor_flag() -> None:
    text = "processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\nmodel name\t: EPYC\n"
    out = cpuinfo_without_hypervisor(text)
    assert "hypervisor" not in out
    assert "fpu vme lahf_lm" in out and "model name\t: EPYC" in out and out.startswith("processor\t: 0\n")


def test_mirror_from_deb822_and_one_line_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(chroots.MIRROR_ENV, raising=False)
    folder = tmp_path / "sources.list.d"
    folder.mkdir()
    (folder / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
    )
    monkeypatch.setattr(chroots, "_SOURCES", (tmp_path / "sources.list", folder))
    assert debian_mirror() == "http://mirror.example/debian"
    (folder / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb [arch=amd64] http://other.example/debian bookworm main\n")
    assert debian_mirror() == "http://other.example/debian"
    (tmp_path / "sources.list").write_text("deb https://packages.cloud.google.com/apt cloud-sdk main\n")
    with pytest.raises(ChrootBuildError, match="no Debian mirror"):
        debian_mirror()
    monkeypatch.setenv(chroots.MIRROR_ENV, "http://pinned.example/debian/")
    assert debian_mirror() == "http://pinned.example/debian"


def test_cache_key_follows_pins_and_mirror() -> None:
    assert chroot_key(TRIXIE, "http://a/debian") == chroot_key(TRIXIE, "http://a/debian")
    assert chroot_key(TRIXIE, "http://a/debian") != chroot_key(TRIXIE, "http://b/debian")
    assert chroot_key(TRIXIE, "http://a/debian") != chroot_key(SID, "http://a/debian")


def test_a_failed_build_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(chroots.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv(chroots.MIRROR_ENV, "http://127.0.0.1:9/debian")  # nothing listens on the discard port
    monkeypatch.setattr(chroots, "_BUILD_TIMEOUT_S", 120.0)
    if chroots.shutil.which("mmdebstrap") is None:
        with pytest.raises(ChrootBuildError, match="mmdebstrap is not installed"):
            chroots.ensure_chroot(TRIXIE)
        return
    with pytest.raises(ChrootBuildError) as failure:
        chroots.ensure_chroot(TRIXIE)
    message = str(failure.value)
    assert message.startswith("building the trixie chroot from http://127.0.0.1:9/debian failed:")
    assert "\n" not in message and "full log:" in message
    assert not list(tmp_path.glob("trixie-*/.complete")) and not list(tmp_path.glob("*.partial"))
