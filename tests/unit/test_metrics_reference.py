"""The README's metric reference is generated from the metric table, kept in sync, and agrees with
what /metrics really serves (the golden scrape of a simulated MI210+MI250X+MI300X node)."""

import re
from pathlib import Path

from exporter.exposition.metrics_reference import BEGIN, END, replace_reference
from tests.golden.golden_metrics import GOLDEN_FILES

README = Path(__file__).resolve().parents[2] / "README.md"
_ROW = re.compile(r"^\| `(?P<name>[a-z_:][a-z0-9_:]*)` \| (?P<kind>\w+) \| (?P<unit>[a-z_]*) \| (?P<labels>[^|]*) \|")
_TYPE = re.compile(r"^# TYPE (?P<name>\S+) (?P<kind>\S+)$")

# Families the reference lists that the golden scrape (sysfs source, no Alertmanager) cannot show.
ONLY_WITH_ROCM_SMI = {"amdgpu_exporter_worker_restarts_total": "counter"}
# Families read from the host at daemon start (kernel, driver, ROCm, SMI libraries): the golden
# renderer has no host, so they are pinned by tests/unit/test_host_info_metrics.py instead.
ONLY_WITH_HOST_INFO = {"amdgpu_driver_info": "gauge", "amdgpu_rocm_info": "gauge", "amdgpu_smi_library_info": "gauge"}
# ... nor what only --kubernetes, --slurm.state-dir or --collector.processes serve (tested in test_attribution_daemon).
ONLY_WITH_ATTRIBUTION = {
    "amdgpu_allocation_info": "gauge",
    "amdgpu_job_info": "gauge",
    "amdgpu_job_energy_joules_total": "counter",  # per running job (exporter/accounting/)
    "amdgpu_job_gpu_seconds_total": "counter",
    "amdgpu_exporter_attribution_up": "gauge",
    "amdgpu_process_memory_bytes": "gauge",
    "amdgpu_process_compute_unit_occupancy_ratio": "gauge",
    "amdgpu_process_sdma_seconds_total": "counter",
}
# ... nor what only --collector.xcc serves (tested in tests/unit/test_partition_metrics.py and the oracles).
ONLY_WITH_COLLECTOR_XCC = {
    "amdgpu_media_engine_busy_ratio": "gauge",
    "amdgpu_xcc_below_host_limit_seconds_total": "counter",
}
# ... nor the HTTP layer's own, only with --web.config.file (tested in test_web_security).
ONLY_WITH_WEB_CONFIG = {
    "amdgpu_exporter_web_config_last_reload_successful": "gauge",
    "amdgpu_exporter_http_rejections_total": "counter",
    "amdgpu_exporter_http_connections": "gauge",
    "amdgpu_exporter_http_max_connections": "gauge",
}
# ... nor the Slurm action mode's counters, only with --action.slurm (tested in test_slurm_actions*).
ONLY_WITH_ACTIONS = {"amdgpu_exporter_actions_total": "counter"}
# ... nor the device-plugin health service's, only with --device-plugin.socket (test_device_plugin_health_e2e).
ONLY_WITH_DEVICE_PLUGIN = {"amdgpu_exporter_device_plugin_calls_total": "counter"}
# ... nor what is served only while a GPU is unfit (tested in test_health_e2e).
ONLY_WHILE_UNFIT = {"amdgpu_health_suggestion_info": "gauge"}
# Families the scrape shows that the reference does not list (none since the poll histogram lost
# its _created gauge).
NOT_IN_THE_REFERENCE_YET: dict[str, str] = {}


def _readme_reference() -> dict[str, str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(BEGIN) : text.index(END)]
    rows = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is not None:
            assert match["name"] not in rows, f"{match['name']} listed twice"
            rows[match["name"]] = match["kind"]
    return rows


def _served_families() -> dict[str, str]:
    """name -> type of every family the committed golden /metrics (text format) declares."""
    lines = GOLDEN_FILES[False].read_text(encoding="utf-8").splitlines()
    return {m["name"]: m["kind"] for m in map(_TYPE.match, lines) if m is not None}


def test_readme_reference_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert replace_reference(text) == text, "run: python -m exporter.exposition.metrics_reference --write"


def test_readme_reference_lists_exactly_what_metrics_serves_with_its_type() -> None:
    reference = _readme_reference()
    served = _served_families()
    assert len(reference) > 40 and len(served) > 40, "the table or the golden scrape did not parse"
    assert (
        reference | NOT_IN_THE_REFERENCE_YET
        == served
        | ONLY_WITH_ROCM_SMI
        | ONLY_WITH_ATTRIBUTION
        | ONLY_WITH_COLLECTOR_XCC
        | ONLY_WITH_WEB_CONFIG
        | ONLY_WITH_HOST_INFO
        | ONLY_WHILE_UNFIT
        | ONLY_WITH_ACTIONS
        | ONLY_WITH_DEVICE_PLUGIN
    )


def test_readme_reference_labels_are_the_labels_served() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(BEGIN) : text.index(END)]
    labels = {
        m["name"]: {label.strip() for label in m["labels"].split(",") if label.strip()}
        for m in map(_ROW.match, section.splitlines())
        if m is not None
    }
    series = re.compile(r"^(?P<name>[a-z_:][a-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? ")
    seen: dict[str, set[str]] = {}
    for line in GOLDEN_FILES[False].read_text(encoding="utf-8").splitlines():
        match = series.match(line)
        if match is None:
            continue
        names = re.findall(r'([a-z_]+)="', match["labels"] or "")
        family = re.sub(r"_(bucket|count|sum)$", "", match["name"])
        seen.setdefault(family, set()).update(n for n in names if n != "le")
    assert seen, "no series parsed from the golden scrape"
    for family, served in seen.items():
        if family in NOT_IN_THE_REFERENCE_YET:
            continue
        assert served <= labels[family], f"{family} serves labels {served - labels[family]} the reference omits"
