"""Settings: flags > environment (AMDGPU_EXPORTER_*) > YAML file > defaults, validated.

Every option is declared once in OPTIONS; the flag, the environment variable and the YAML key
are all derived from its name, so the three can never drift apart.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
import re
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode

from exporter import boundedfile, safeyaml
from exporter.model import IDENTITY_FIELDS
from exporter.sources.select import SourceChoice


class ConfigError(ValueError):
    """A bad flag, environment variable or config file; the message is one clear sentence."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'1s', '500ms', '2m', '1.5' (seconds) -> seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 1s, 500ms, 2m)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{text!r} must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> "1h2m3s" style text for messages."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    whole = int(seconds)
    parts = []
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    rest = seconds - int(seconds) + whole
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def bounded_duration(low: float, high: float) -> Callable[[str], float]:
    """A duration parser that refuses values outside [low, high] seconds.

    Why bounds: a poll interval of 1 µs burns a core re-reading sysfs, and one of 10^14 hours
    overflows the event loop's timer; neither is ever meant.
    """

    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not low <= seconds <= high:
            raise ValueError(f"{str(text).strip()!r} is outside {format_duration(low)}..{format_duration(high)}")
        return seconds

    parse.bounds = (low, high)  # type: ignore[attr-defined]  # shown by --help
    return parse


def parse_http_url(text: str) -> str:
    """An http:// or https:// URL with a host (Alertmanager)."""
    parts = urlsplit(str(text).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host (example: http://alertmanager:9093)")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as error:
        raise ValueError(f"{text!r} has a bad port: {error}") from error
    return str(text).strip()


def parse_fast_interval(text: str) -> float:
    """A duration of at least 10 ms, or 0 (the fast sampler off)."""
    if str(text).strip() in ("0", "0s", "0ms"):
        return 0.0
    seconds = parse_duration(text)
    if seconds < 0.01:
        raise ValueError(f"{text!r} is shorter than 10ms (use 0 to turn the fast sampler off)")
    if seconds > 3600:
        raise ValueError(f"{str(text).strip()!r} is outside 10ms..1h (use 0 to turn the fast sampler off)")
    return seconds


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def parse_listen_address(text: str) -> tuple[str, int]:
    """':9442' -> ('0.0.0.0', 9442); '127.0.0.1:9442'; '[::1]:9442'."""
    text = str(text).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) < 65536:
        raise ValueError(f"{text!r} is not host:port (examples: :9442, 127.0.0.1:9442, [::1]:9442)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    parse.choices = allowed  # type: ignore[attr-defined]  # shown once, as the flag's metavar
    return parse


def _telemetry_path(text: str) -> str:
    if not text.startswith("/") or text in ("/", "/healthz", "/readyz") or text.startswith("/api/"):
        raise ValueError(f"{text!r} must be a path such as /metrics, not / or one of the API paths")
    return text


_DEMO_FLEET = "4xMI250X"
_DEMO_SCENARIO = "training"


def _fleet(text: str) -> str:
    if text == _DEMO_FLEET:
        return text  # the default, parsed by the simulator's tests: importing its ASIC tables costs every daemon ~3 MB
    from exporter.simulator.fleet import parse_fleet

    parse_fleet(text)  # ValueError names what is wrong
    return text


def _scenario(text: str) -> str:
    if text == _DEMO_SCENARIO:
        return text
    from exporter.simulator.workload import parse_scenario

    parse_scenario(text)
    return text


def _positive_int(text: str | int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise ValueError(f"{text!r} must be at least 1")
    return value


# The longest path a unix socket address holds (sun_path is 108 bytes with its terminating NUL).
_MAX_SOCKET_PATH = 107
# Where AMD's device-metrics-exporter serves its health gRPC service, and where ROCm's device plugin asks.
DME_HEALTH_SOCKET = "/var/lib/amd-metrics-exporter/amdgpu_device_metrics_exporter_grpc.socket"


def _socket_path(text: str) -> str:
    """An absolute path for a unix socket to be created at, or "" (off)."""
    text = str(text).strip()
    if not text:
        return ""
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path (example: {DME_HEALTH_SOCKET})")
    if len(text.encode()) > _MAX_SOCKET_PATH:
        raise ValueError(f"{text!r} is longer than a unix socket path may be ({_MAX_SOCKET_PATH} bytes)")
    return text


def _resource_prefix(text: str) -> str:
    text = str(text).strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not a Kubernetes resource name prefix (example: amd.com/)")
    return text


def _identity_labels(text: str | Sequence[str]) -> tuple[str, ...]:
    """'serial,product' (or a YAML list) -> ('serial', 'product'): labels of amdgpu_device_info."""
    names = [str(part).strip() for part in (text.split(",") if isinstance(text, str) else text)]
    names = [name for name in names if name]
    unknown = [name for name in names if name not in IDENTITY_FIELDS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a label of amdgpu_device_info ({', '.join(IDENTITY_FIELDS)})")
    return tuple(dict.fromkeys(names))


def _action_mode(text: str | bool) -> str:
    """off | dry-run | on; a config file's YAML `on` / `off` (booleans to YAML) mean the same."""
    if isinstance(text, bool):
        return "on" if text else "off"
    text = str(text).strip()
    if text not in ("off", "dry-run", "on"):
        raise ValueError(f"{text!r} is not one of off, dry-run, on")
    return text


_action_mode.choices = ("off", "dry-run", "on")  # type: ignore[attr-defined]


def _share(text: str | float) -> float:
    """A share of a partition's nodes, 0 < share <= 1."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a number (example: 0.1)") from None
    if not 0 < value <= 1:
        raise ValueError(f"{text!r} must be above 0 and at most 1 (example: 0.1)")
    return value


def _glob(text: str) -> str:
    """A name or a glob (*, ?, [...]) on collector or family names; checked against them by the exposition."""
    text = str(text).strip()
    if not text or any(c.isspace() or c in ",{}" for c in text):
        raise ValueError(f"{text!r} is not a name or a glob (examples: pcie, amdgpu_xgmi_*)")
    return text


@dataclass(frozen=True)
class Option:
    name: str  # "web.listen-address": flag --web.listen-address, env AMDGPU_EXPORTER_WEB_LISTEN_ADDRESS
    parse: Callable[[Any], Any]
    default: Any
    help: str
    repeatable: bool = False
    is_flag: bool = False  # a switch with no value on the command line
    default_text: str = ""  # how --help shows the default when the value itself says nothing ("")

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(getattr(self.parse, "choices", ()))

    @property
    def metavar(self) -> str:
        if self.choices:
            return "{" + ",".join(self.choices) + "}"
        if hasattr(self.parse, "bounds"):
            return "DURATION"
        if self.parse is parse_listen_address:
            return "HOST:PORT"
        if self.parse is parse_http_url:
            return "URL"
        if self.name.startswith("path.") or self.name.endswith("file"):
            return "PATH"
        return "VALUE"

    @property
    def flag(self) -> str:
        return "--" + self.name

    @property
    def env(self) -> str:
        return "AMDGPU_EXPORTER_" + self.dest.upper()

    @property
    def dest(self) -> str:
        return re.sub(r"[^A-Za-z0-9]", "_", self.name)

    def value(self, raw: Any) -> Any:
        """The parsed value of a raw one (a repeatable option's: of each item); ValueError or TypeError when bad."""
        if self.repeatable:
            items: Sequence[Any] = [raw] if isinstance(raw, str) else list(raw or ())
            return tuple(self.parse(item) for item in items)
        return self.parse(raw)

    def where(self, origin: str, config_file: str) -> str:
        """Where a value from `origin` ("env", "file", else the flag) is given, for an error message."""
        return {"env": self.env, "file": f"{self.name} in {config_file}"}.get(origin, self.flag)


OPTIONS: tuple[Option, ...] = (
    # --- web (issue 14: --web.config.file, TLS, auth, listeners) ---
    Option(
        "web.listen-address",
        parse_listen_address,
        (":9442",),
        "address to serve HTTP on; repeatable, [::]:9442 for IPv6",
        repeatable=True,
    ),
    Option("web.config.file", str, "", "exporter-toolkit web configuration (TLS, basic auth, rate limit, headers)"),
    Option(
        "web.systemd-socket",
        parse_bool,
        False,
        "serve on the sockets systemd passes (socket activation) instead of --web.listen-address",
        is_flag=True,
    ),
    Option("web.max-connections", _positive_int, "512", "cap on open HTTP connections (lowered to the file budget)"),
    # --- end web ---
    Option("web.telemetry-path", _telemetry_path, "/metrics", "path of the Prometheus metrics"),
    Option(
        "metrics.identity-labels",
        _identity_labels,
        "",
        "labels of amdgpu_device_info to copy onto every per-GPU series, comma-separated (e.g. serial,product,"
        "pci_bus_id), for tooling that cannot join on gpu; each adds its value to every series' size",
        default_text="none",
    ),
    Option(
        "collectors.include",
        _glob,
        (),
        "collectors (groups of metric families: pcie, xgmi, windows, firmware, topology, ...; see docs/design.md) "
        "whose families are read and rendered even if off by default (--collector.NAME says the same); globs, "
        "repeatable; in a config file also `collectors: {include: [...]}`",
        repeatable=True,
    ),
    Option(
        "collectors.exclude",
        _glob,
        (),
        "collectors whose families are neither read nor rendered (--no-collector.NAME says the same); globs, "
        "repeatable (the families lists win over these)",
        repeatable=True,
    ),
    Option(
        "families.include",
        _glob,
        (),
        "metric families read and rendered even if off by default (amdgpu_firmware_info, amdgpu_xgmi_*_bytes, ...); "
        "globs on "
        "the family name with or without _total, repeatable",
        repeatable=True,
    ),
    Option(
        "families.exclude",
        _glob,
        (),
        "metric families neither read nor rendered; globs, repeatable (an exclude wins over an include)",
        repeatable=True,
    ),
    Option(
        "window.all-series",
        parse_bool,
        False,
        "render every sensor, engine, domain and stat of the *_window_* families, not only those the shipped "
        "dashboards and rules read (junction min/max, power, gfx busy, gfx clock min/max)",
        is_flag=True,
    ),
    Option("path.sysfs", str, "/sys", "the folder that stands for /sys, e.g. a simulator's tree"),
    Option("interval", bounded_duration(0.01, 3600), "1s", "time between poll cycles"),
    Option(
        "read-timeout",
        bounded_duration(0.01, 300),
        "2s",
        "deadline for one device read; a device missing it is marked down",
    ),
    Option(
        "discovery-interval",
        # Down to 10 ms (tests stress rediscovery): one discovery thread, never two at once.
        bounded_duration(0.01, 86400),
        "5m",
        "how often devices, identity and topology are re-read",
    ),
    Option(
        "slow-interval",
        bounded_duration(0.1, 86400),
        "10s",
        "how often caps, thresholds, DPM tables and RAS counts are re-read",
    ),
    Option(
        "fast.interval",
        parse_fast_interval,
        "100ms",
        "time between fast gpu_metrics reads for the sliding windows and /api/v1/waveform; 0 turns them off",
    ),
    Option(
        "window",
        bounded_duration(0.02, 3600),
        "15s",
        "length of the sliding windows (min, max, mean of the fast samples)",
    ),
    Option("source", _choice("auto", "sysfs", "rocm-smi", "amd-smi"), "auto", "where values come from"),
    Option("rules.file", str, "", "YAML file of in-daemon alert rules", default_text="the shipped rules"),
    Option(
        "alertmanager.url",
        parse_http_url,
        (),
        "Alertmanager to push alerts to; repeatable",
        repeatable=True,
    ),
    Option(
        "node-name",
        str,
        "",
        "the `node` label of pushed alerts (Kubernetes: set the env from spec.nodeName)",
        default_text="the host name",
    ),
    Option(
        "alerting.runbook-base",
        str,
        "",
        "prefix of pushed alerts' runbook_url (docs/runbooks.md#...), as the Prometheus rules' --runbook-base",
    ),
    Option(
        "alerting.clock-tool",
        _choice("auto", "rocm-smi", "amd-smi"),
        "auto",
        "tool the clock-down commands are written for; auto: amd-smi on ROCm 6+ or MI300-class, else rocm-smi",
    ),
    Option("log.level", _choice("debug", "info", "warn", "error"), "info", "log level"),
    Option(
        "log.format",
        _choice("auto", "json", "console"),
        "auto",
        "log format; auto is console on a terminal, JSON otherwise",
    ),
    Option("demo", parse_bool, False, "serve a built-in simulated node instead of real GPUs", is_flag=True),
    Option(
        "demo.fleet",
        _fleet,
        _DEMO_FLEET,
        "simulated fleet for --demo: [N x]MODEL[:OPTION...] terms, comma-separated, e.g. 4xMI250X, 2xMI210,"
        " 2xMI300X:CPX:NPS4, MI300X:gpu_metrics=1.5 (models MI210, MI250X, MI300X, MI325X, MI350X, MI355X;"
        " options: SPX|DPX|QPX|CPX, NPS1|NPS2|NPS4, gpu_metrics=1.N (unset: the table a current kernel writes,"
        " docs/support-matrix.md), xcp_names=dot, xcp_metrics=1.0|1.1, xcp_nodes=all, serial=unique_id, guest"
        " (MI300X/MI325X as an SR-IOV VM guest sees them);"
        " `amdgpu-exporter simulate --help` lists them per model)",
    ),
    Option(
        "demo.scenario",
        _scenario,
        _DEMO_SCENARIO,
        # simulator.workload.scenario_help(), written out: importing the simulator costs the daemon
        # ~0.15 s at start (tests/unit/test_simulator.py holds the two the same)
        "simulated workload for --demo and its options: idle; training: period, load, xgmi_down, down_at;"
        " thermal-excursion: period, start, hot, peak, gpus, load, xgmi_down, down_at; alternating: "
        "period, duty, swing, window, tick, load, xgmi_down, down_at; every one also: faults, fault_at, "
        "fault_for (NAME:KEY=VALUE,...: seconds for period/start/hot/window/tick/down_at, °C for "
        "peak/swing, duty 0.05-0.95, load a power factor, gpus=GCD+GCD (an MI250X has two GCDs, an MI300X"
        " socket is one), xgmi_down=GCD.LINK+GCD.LINK, faults=KIND.GCD+KIND.GCD, KIND one of ecc_ce, "
        "ecc_ue, ecc_de, bad_pages, cper_fatal, cper_nonfatal, cper_corrected, reset, aer_correctable, "
        "aer_nonfatal, aer_fatal, xgmi_down, pcie_downtrain, throttle: from fault_at (5 s unless given) "
        "for fault_for (30 s) seconds, then recovering; e.g. thermal-excursion:start=10,hot=60,gpus=0+3 "
        "or training:faults=ecc_ue.0+aer_fatal.1,fault_at=5,fault_for=20)",
    ),
    Option(
        "demo.truth-file",
        str,
        "",
        "with --demo: rewrite the simulator's true values as JSON here on every tick",
    ),
    Option(
        "kubernetes",
        parse_bool,
        False,
        "amdgpu_allocation_info{gpu, pod, namespace, container, resource}: the pods holding each GPU, from the kubelet",
        is_flag=True,
    ),
    Option(
        "kubernetes.pod-resources-socket",
        str,
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "the kubelet's pod-resources API socket, for --kubernetes",
    ),
    Option(
        "kubernetes.interval",
        bounded_duration(0.1, 3600),
        "10s",
        "with --kubernetes: time between two reads of the kubelet",
    ),
    Option(
        "kubernetes.timeout",
        bounded_duration(0.01, 300),
        "2s",
        "with --kubernetes: deadline for the kubelet's answer (late: amdgpu_exporter_attribution_up 0)",
    ),
    Option(
        "kubernetes.resource-prefix",
        _resource_prefix,
        ("amd.com/",),
        "device-plugin resource names counted as GPUs, by prefix (repeatable)",
        repeatable=True,
    ),
    Option(
        "slurm.state-dir",
        str,
        "",
        "amdgpu_job_info{gpu, job_id, job_user, job_partition}: the Slurm jobs holding each GPU, from the "
        "files deploy/slurm/prolog.sh writes here (default folder: /run/amdgpu-exporter/slurm; AMD exporter's "
        "/var/run/exporter works too), read every --interval; off when empty",
        default_text="off",
    ),
    Option(
        "accounting.state-file",
        str,
        "/var/lib/amdgpu-exporter/jobs.json",
        "with --kubernetes / --slurm.state-dir: where per-job accounting (/api/v1/jobs, docs/accounting.md) keeps "
        "running and recently ended jobs across restarts, written atomically; empty: in memory only (the "
        "default with --demo or a --path.sysfs other than /sys)",
    ),
    Option(
        "collector.processes",
        parse_bool,
        False,
        "the processes collector: per-process VRAM, CU occupancy and SDMA time per GPU from the KFD (one series "
        "per process per GPU), read every --slow-interval; the same as `collectors.include: [processes]`",
        is_flag=True,
    ),
    Option("collector.processes.top", _positive_int, 16, "with --collector.processes: the N processes per GPU by VRAM"),
    Option(
        "collector.board-temperatures",
        parse_bool,
        False,
        "deprecated, for one release: --families.include=amdgpu_board_temperature_celsius says it (the 19 "
        "sensors of each MI350X/MI355X GPU's own board)",
        is_flag=True,
    ),
    Option(
        "attribution.series-labels",
        parse_bool,
        False,
        "with --kubernetes / --slurm.state-dir: the pod and job labels on every per-GPU series too, not only on "
        "amdgpu_allocation_info / amdgpu_job_info (every job then starts a new set of each GPU's series)",
        is_flag=True,
    ),
    Option(
        "collector.xcc",
        parse_bool,
        False,
        "the xcc collector whole: per-XCC clock-below-host-limit seconds (power, thermal, low utilisation, "
        "total) and per-engine VCN/JPEG busy on MI300-class GPUs (up to 76 series per GPU) besides per-XCC busy; "
        "the same as `collectors.include: [xcc]` (as an environment variable or config key: deprecated)",
        is_flag=True,
    ),
    # --- acting on the verdict (exporter/actions/): off unless asked for ---
    Option(
        "action.slurm",
        _action_mode,
        "off",
        "run the Slurm drain and resume the health verdict suggests for this node (--node-name must be its "
        "Slurm NodeName): off, dry-run (log and count what would run) or on; bounded by the "
        'action.slurm.* options below (docs/health.md, "Acting on the verdict")',
    ),
    Option(
        "action.slurm.max-drained-share",
        _share,
        "0.1",
        "with --action.slurm: a drain is refused while any partition of the node would have more than this "
        "share (0..1] of its nodes drained, draining or down with it",
    ),
    Option(
        "action.slurm.max-actions",
        _positive_int,
        "2",
        "with --action.slurm: at most this many drains and resumes (together) per --action.slurm.actions-interval",
    ),
    Option(
        "action.slurm.actions-interval",
        bounded_duration(1, 7 * 86400),
        "1h",
        "with --action.slurm: the interval --action.slurm.max-actions counts in",
    ),
    Option(
        "action.slurm.retry-interval",
        bounded_duration(0.1, 86400),
        "1m",
        "with --action.slurm: how soon a refused, rate-limited or failed action is tried again (a drain "
        "also waits a random 0..half of it first, so nodes failing at once ask Slurm one after another)",
    ),
    Option(
        "action.slurm.timeout",
        bounded_duration(0.1, 300),
        "10s",
        "with --action.slurm: deadline of one sinfo or scontrol run (killed after it: that action failed)",
    ),
    # --- the per-GPU health signal for ROCm's Kubernetes device plugin: off unless asked for ---
    Option(
        "device-plugin.socket",
        _socket_path,
        "",
        "serve the health verdict per GPU on this unix socket as AMD device-metrics-exporter's gRPC "
        "MetricsService does, for ROCm's k8s-device-plugin (its heartbeat, -pulse, asks "
        f'{DME_HEALTH_SOCKET}); empty: off (docs/health.md, "Acting on the verdict per GPU")',
        default_text="off",
    ),
)
# Options kept one release for their old spelling: option -> (what it adds to, the value, the warning).
DEPRECATED = {
    "collector.board-temperatures": (
        "families_include",
        "amdgpu_board_temperature_celsius",
        "collector.board-temperatures is deprecated and goes in the next release: use "
        "--families.include=amdgpu_board_temperature_celsius (or `families: {include: [...]}`)",
    ),
    "collector.xcc": (
        "collectors_include",
        "xcc",
        "collector.xcc as an environment variable or config key is deprecated and goes in the next release: "
        "use `collectors: {include: [xcc]}` (the flag --collector.xcc stays: the xcc collector's own)",
    ),
}
OPTION_BY_NAME = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    web_listen_address: tuple[tuple[str, int], ...]
    web_config_file: str
    web_systemd_socket: bool
    web_max_connections: int
    web_telemetry_path: str
    metrics_identity_labels: tuple[str, ...]
    collectors_include: tuple[str, ...]
    collectors_exclude: tuple[str, ...]
    families_include: tuple[str, ...]
    families_exclude: tuple[str, ...]
    window_all_series: bool
    path_sysfs: str
    interval: float
    read_timeout: float
    discovery_interval: float
    slow_interval: float
    fast_interval: float
    window: float
    source: str
    rules_file: str
    alertmanager_url: tuple[str, ...]
    node_name: str
    alerting_runbook_base: str
    alerting_clock_tool: str
    log_level: str
    log_format: str
    demo: bool
    demo_fleet: str
    demo_scenario: str
    demo_truth_file: str
    kubernetes: bool
    kubernetes_pod_resources_socket: str
    kubernetes_interval: float
    kubernetes_timeout: float
    kubernetes_resource_prefix: tuple[str, ...]
    slurm_state_dir: str
    accounting_state_file: str
    collector_processes: bool
    collector_processes_top: int
    collector_board_temperatures: bool
    attribution_series_labels: bool
    collector_xcc: bool
    action_slurm: str
    action_slurm_max_drained_share: float
    action_slurm_max_actions: int
    action_slurm_actions_interval: float
    action_slurm_retry_interval: float
    action_slurm_timeout: float
    device_plugin_socket: str
    config_file: str = ""
    origins: Mapping[str, str] = field(default_factory=dict)  # option -> "flag" | "env" | "file" | "default"
    warnings: tuple[str, ...] = ()  # deprecated options given: logged at start

    def source_choice(self, wanted: frozenset[str] | None = None) -> SourceChoice:
        """The few values select_source reads (the sources sit below the settings). `wanted`: the Sample
        fields the shown families are made of (exposition.selection.read_fields); None: the source's choice."""
        return SourceChoice(
            source=self.source,
            slow_interval=self.slow_interval,
            read_timeout=self.read_timeout,
            wanted=wanted,
        )


def node_name(settings: Settings) -> str:
    """The `node` of pushed alerts, the status page and /api/v1/devices: --node-name (on Kubernetes
    the downward API's spec.nodeName in AMDGPU_EXPORTER_NODE_NAME, as deploy/kubernetes/daemonset.yaml
    sets it), else the host name."""
    return settings.node_name.strip() or socket.gethostname()


def _help(option: Option) -> str:
    default = option.default_text or (", ".join(option.default) if option.repeatable else str(option.default))
    default = default or "none"  # never "(default: )"
    default_part = "" if option.is_flag else f" (default: {default})"
    bounds = getattr(option.parse, "bounds", None)
    if bounds is not None:
        default_part = f" (default: {default}; {format_duration(bounds[0])}..{format_duration(bounds[1])})"
    suffix = ", comma-separated" if option.repeatable else ""
    return f"{option.help}{default_part} [env {option.env}{suffix}]"


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, collectors: Sequence[str] = ()) -> None:
    """Every option's flag, and for each collector named --collector.NAME and --no-collector.NAME
    (the metric table names them: the command line, above the table, passes them in)."""
    for option in OPTIONS:
        how: dict[str, Any] = {"action": "append" if option.repeatable else "store", "metavar": option.metavar}
        if option.is_flag:
            how = {"action": "store_const", "const": True}
        parser.add_argument(option.flag, dest=option.dest, default=None, help=_help(option), **how)
    for name in collectors:
        if f"collector.{name}" not in OPTION_BY_NAME:  # --collector.processes and --collector.xcc are options
            parser.add_argument(
                f"--collector.{name}",
                dest="collectors_include",
                action="append_const",
                const=name,
                help=f"read and show the {name} collector's families, those off by default too",
            )
        parser.add_argument(
            f"--no-collector.{name}",
            dest="collectors_exclude",
            action="append_const",
            const=name,
            help=f"neither read nor show the {name} collector's families",
        )
    parser.add_argument(
        "--config.file",
        dest="config_file",
        default=None,
        metavar="PATH",
        help="YAML file with any of the options above as keys [env AMDGPU_EXPORTER_CONFIG_FILE]",
    )


# A config file is a few kB; this still holds the longest lists accepted (4096 globs each). A larger
# file is refused before YAML reads it: parsing 30,000 list items took ~20 s of CPU (and the GIL).
MAX_CONFIG_BYTES = 256 * 1024


def read_config_values(path: str) -> dict[str, tuple[Any, str]]:
    """Option name -> (its raw value, "config file PATH line N"), for every option a config file sets.

    The one reader of a config file: `serve`, `check-config` and a SIGHUP reload all go through it,
    so they accept and refuse the same files in the same words. Bounded (size, UTF-8, depth and
    alias expansion are checked by safeyaml before YAML builds anything); an unknown option or one
    given twice is an error naming its line (PyYAML itself would keep the last, silently).
    """
    try:
        text = boundedfile.read_text(path, "config file", MAX_CONFIG_BYTES)
        root = safeyaml.compose(text, f"config file {path}")
    except (boundedfile.FileReadError, safeyaml.YamlLimitError) as error:
        raise ConfigError(str(error)) from error
    if root is None:
        return {}
    if not isinstance(root, MappingNode):
        raise ConfigError(
            f"config file {path} line {root.start_mark.line + 1}: the file must be a mapping of option: value"
        )
    constructor = SafeConstructor()
    known = {option.name for option in OPTIONS}
    values: dict[str, tuple[Any, str]] = {}
    first_line: dict[str, int] = {}
    for key_node, value_node in _flattened(constructor, root, path, known):
        number = key_node.start_mark.line + 1
        line = f"config file {path} line {number}"
        key = _construct_node(constructor, key_node, line)
        if not isinstance(key, str) or key not in known:
            raise ConfigError(f"{line}: unknown option {key!r} (known: {', '.join(sorted(known))})")
        if key in values:
            raise ConfigError(f"{line}: option {key!r} is given twice (lines {first_line[key]} and {number})")
        values[key] = (_construct_node(constructor, value_node, line), line)
        first_line[key] = number
    return values


def _flattened(
    constructor: SafeConstructor, root: MappingNode, path: str, known: set[str]
) -> Iterator[tuple[Node, Node]]:
    """The (key, value) nodes of the file, where a key that is no option but a group of them
    (`families: {include: [...]}`) stands for its dotted options (`families.include`)."""
    for key_node, value_node in root.value:
        key = key_node.value if isinstance(key_node, ScalarNode) else None
        if key in known or not isinstance(value_node, MappingNode) or not any(o.startswith(f"{key}.") for o in known):
            yield key_node, value_node
            continue
        for sub_node, sub_value in value_node.value:
            sub = sub_node.value if isinstance(sub_node, ScalarNode) else sub_node
            dotted = ScalarNode("tag:yaml.org,2002:str", f"{key}.{sub}", sub_node.start_mark, sub_node.end_mark)
            yield dotted, sub_value


def _construct_node(constructor: SafeConstructor, node: Node, line: str) -> Any:
    try:
        return constructor.construct_object(node, deep=True)
    except (ConstructorError, ValueError) as error:
        raise ConfigError(f"{line}: cannot read value: {error}") from error


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """A warning for each AMDGPU_EXPORTER_* variable that sets no option (a typo is otherwise silently
    ignored), with the nearest known name."""
    prefix = "AMDGPU_EXPORTER_"
    known = [option.env.removeprefix(prefix) for option in OPTIONS] + ["CONFIG_FILE"]
    warnings = []
    for name in sorted(name for name in environ if name.startswith(prefix) and name[len(prefix) :] not in known):
        near = difflib.get_close_matches(name[len(prefix) :], known, n=1, cutoff=0.75)
        hint = f"; did you mean {prefix}{near[0]}?" if near else ""
        warnings.append(f"unknown environment variable {name} is ignored{hint}")
    return warnings


def no_flags() -> argparse.Namespace:
    """The arguments of a command line that gives no option (check-config reads only file and environment)."""
    return argparse.Namespace(config_file=None, **{option.dest: None for option in OPTIONS})


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    config_file = args.config_file or environ.get("AMDGPU_EXPORTER_CONFIG_FILE", "")
    from_file = {name: raw for name, (raw, _) in read_config_values(config_file).items()} if config_file else {}
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for option in OPTIONS:
        raw: Any = getattr(args, option.dest, None)
        origin = "flag"
        if raw is None and option.env in environ:
            raw, origin = environ[option.env], "env"
            if option.repeatable:
                raw = [part.strip() for part in str(raw).split(",") if part.strip()]
        if raw is None and option.name in from_file:
            raw, origin = from_file[option.name], "file"
        if raw is None:
            raw, origin = option.default, "default"
        try:
            values[option.dest] = option.value(raw)
        except (ValueError, TypeError) as error:
            raise ConfigError(f"{option.where(origin, config_file)}: {error}") from error
        origins[option.name] = origin
    if values["fast_interval"] and values["window"] < 2 * values["fast_interval"]:
        raise ConfigError(
            f"--window ({values['window']:g}s) must hold at least two fast samples"
            f" (--fast.interval {values['fast_interval']:g}s)"
        )
    warnings = collector_options(values, origins)  # first: it folds the collector switches into `values`
    settings = Settings(**values, config_file=config_file, origins=origins, warnings=warnings)
    _check_paths(settings, config_file)
    return settings


def collector_options(values: dict[str, Any], origins: Mapping[str, str]) -> tuple[str, ...]:
    """Fold the collector switches into the include lists (in place), and the processes collector's
    selection back into collector_processes, the attribution source's switch; the deprecation warnings."""
    warnings = []
    for name, (dest, value, warning) in DEPRECATED.items():
        if values[OPTION_BY_NAME[name].dest]:
            values[dest] = (*values[dest], value)
            if name != "collector.xcc" or origins.get(name) in ("env", "file"):
                warnings.append(warning)
    if values["collector_processes"]:
        values["collectors_include"] = (*values["collectors_include"], "processes")
    included = any(fnmatch.fnmatchcase("processes", p) for p in values["collectors_include"])
    excluded = any(fnmatch.fnmatchcase("processes", p) for p in values["collectors_exclude"])
    values["collector_processes"] = included and not excluded
    return tuple(warnings)


def _check_paths(settings: Settings, config_file: str) -> None:
    """Folders and files must exist before anything is started (--demo makes its own /sys)."""
    if not settings.demo and not os.path.isdir(settings.path_sysfs):
        where = OPTION_BY_NAME["path.sysfs"].where(settings.origins.get("path.sysfs", ""), config_file)
        what = "is not a folder" if os.path.exists(settings.path_sysfs) else "is missing (no such folder)"
        raise ConfigError(f"{where}: {settings.path_sysfs} {what}")
    if settings.rules_file and not os.path.isfile(settings.rules_file):
        raise ConfigError(f"--rules.file: {settings.rules_file} is missing (no such file)")
