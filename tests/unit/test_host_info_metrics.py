"""The version matrix on /metrics: driver, ROCm and SMI library _info series from the host facts,
and no such family at all when the host was not read."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.render import render
from exporter.model import ExporterStats, Published, Snapshot
from exporter.sources.host import HostFacts, LibraryVersion, collect, host_info


def _series(published: Published) -> dict[str, list[dict[str, str]]]:
    text = render(published).body(openmetrics=False, gzipped=False).decode()
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("amdgpu_driver_info", "amdgpu_rocm_info", "amdgpu_smi_library_info"):
                assert sample.value == 1.0
                out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_host_facts_become_info_series(tmp_path: Path) -> None:
    module = tmp_path / "sys" / "module" / "amdgpu"
    (module / "parameters").mkdir(parents=True)
    (module / "version").write_text("6.7.0\n")
    (module / "initstate").write_text("live\n")
    (module / "parameters" / "ppfeaturemask").write_text("0xffffffff\n")
    (tmp_path / "proc" / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "osrelease").write_text("6.8.0-45-generic\n")
    for version in ("6.1.3", "6.2.1"):
        (tmp_path / "opt" / f"rocm-{version}" / ".info").mkdir(parents=True)
        (tmp_path / "opt" / f"rocm-{version}" / ".info" / "version").write_text(f"{version}-100\n")
    facts = collect(
        str(tmp_path / "sys"), str(tmp_path / "proc"), str(tmp_path / "opt"), {}, libraries=(), packages=False
    )
    facts = HostFacts(
        **{
            **{f: getattr(facts, f) for f in facts.__slots__},
            "libraries": (
                LibraryVersion("librocm_smi64", "/usr/lib/x.so", "7.4.0"),
                LibraryVersion("libamd_smi", "/usr/lib/y.so", error="aborted"),
            ),
        }
    )
    stats = ExporterStats(source="sysfs", host=host_info(facts))
    series = _series(Published(snapshot=Snapshot(taken_at=1.0), stats=stats))
    assert series["amdgpu_driver_info"] == [
        {"version": "6.7.0", "initstate": "live", "kernel": "6.8.0-45-generic", "ppfeaturemask": "0xffffffff"}
    ]
    assert series["amdgpu_rocm_info"] == [
        {"version": "6.1.3-100", "path": str(tmp_path / "opt" / "rocm-6.1.3")},
        {"version": "6.2.1-100", "path": str(tmp_path / "opt" / "rocm-6.2.1")},
    ]
    assert series["amdgpu_smi_library_info"] == [{"library": "librocm_smi64", "version": "7.4.0"}]


def test_no_host_no_family() -> None:
    text = render(Published(snapshot=Snapshot(taken_at=1.0))).body(openmetrics=False, gzipped=False).decode()
    assert "amdgpu_driver_info" not in text and "amdgpu_rocm_info" not in text
