"""The one data model: devices and their samples, in SI base units.

Every source (sysfs, rocm_smi) produces these types; the poller bundles them into a Snapshot;
exposition, rules and the JSON API only ever read them. Units are SI base units everywhere:
celsius, watts, joules, bytes, hertz, volts, seconds, ratios in 0..1, transfers per second.

A field a device does not supply is None (or absent from a mapping) — decided afresh on every read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping = MappingProxyType({})


def frozen_map(items: Mapping | None = None) -> Mapping:
    """An immutable mapping, so a Snapshot shared across tasks can never be mutated."""
    return MappingProxyType(dict(items)) if items else _EMPTY


@dataclass(frozen=True, slots=True)
class TopologyLink:
    """One KFD io_link from this device to a peer device (or CPU node)."""

    peer_pci_bus_id: str  # PCI BDF of the peer, "" for a CPU node
    link_type: str  # "xgmi" | "pcie" | other KFD type name
    hops: int
    weight: int
    peer_partition: int = 0  # the peer's compute partition (MI300-class sockets in DPX/QPX/CPX)


@dataclass(frozen=True, slots=True)
class CperRecord:
    """One Common Platform Error Record (UEFI CPER) the driver logged for this device."""

    timestamp: float  # unix seconds at which the record was logged
    severity: str  # "fatal" | "nonfatal" | "corrected" (the CPER header's severity; recoverable is nonfatal)
    afids: tuple[int, ...] = ()  # the AMD Field IDs the record carries (amd-smi's AFID), () when none decoded
    record_id: str = ""  # the record's id as the driver wrote it, "" when none


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """What a device is. Read at discovery and refreshed on a slow schedule, never per cycle.

    Devices are keyed by (pci_bus_id, unique_id, partition): card and hwmon numbers are not stable,
    and every compute partition of an MI300-class socket shares the socket's BDF and unique_id.
    """

    pci_bus_id: str  # "0000:c1:00.0", lower-case
    card: str  # "card3" — for humans, not a key
    device_dir: str  # resolved path of the PCI device directory under the sysfs root
    unique_id: str = ""  # 16 hex digits, "" when the device has none
    hwmon_dir: str = ""  # resolved hwmon directory, "" when none
    vendor_id: str = "0x1002"
    device_id: str = ""  # PCI device id, "0x740c"
    product: str = ""  # marketing name: "AMD Instinct MI250X"
    product_number: str = ""  # the board's part number from its FRU: "102-G30211-00" ("" when none)
    asic: str = ""  # "aldebaran" | "aqua_vanjaram" | ...
    serial: str = ""
    vbios: str = ""
    driver_version: str = ""
    package: str = ""  # physical package id: both GCDs of an MI250X share it
    die: int = 0  # die index within the package (MI250X: 0 or 1)
    partition: int = 0  # compute partition index within the socket (0 when unpartitioned)
    compute_partition: str = ""  # "SPX" | "DPX" | ... ("" when not partitionable)
    memory_partition: str = ""  # "NPS1" ...
    xgmi_hive_id: str = ""
    xgmi_physical_id: int | None = None
    numa_node: int | None = None
    firmware: Mapping[str, str] = field(default_factory=frozen_map)  # block -> "0x0000001a"
    topology: tuple[TopologyLink, ...] = ()
    gpu_metrics_version: str = ""  # "1.3" as read from the header; "" when no table
    secondary_die: bool = False  # an MI250X's second die by its own signals (power cap and its default 0)
    complete: bool = True  # False: discovery could not read this card in time (a hung read); not polled
    # "baremetal": the physical function (or the whole device passed through); "guest": an SR-IOV
    # virtual function inside a VM, which the host lets see only part of the device
    deployment: str = "baremetal"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.pci_bus_id, self.unique_id, self.partition)

    @property
    def identity_source(self) -> str:
        """What keeps this device apart from the others: its unique_id, or its PCI address when it has
        none (a VF's reads empty: the host gives it a unique id of 0)."""
        return "unique_id" if self.unique_id else "pci_bus_id"


# The labels of amdgpu_device_info, each with the DeviceIdentity field it shows (in /metrics order).
_IDENTITY_LABELS = "card pci_bus_id unique_id serial product product_number asic package die partition vbios driver"
IDENTITY_FIELDS: Mapping[str, str] = {
    label: "driver_version" if label == "driver" else label
    for label in (*_IDENTITY_LABELS.split(), "compute_partition", "memory_partition", "deployment", "identity_source")
}


def within(low: float, high: float, low_exclusive: bool = False) -> Any:
    """A scalar Sample field (None: not supplied) whose plausible values are low..high, inclusive
    (above low when `low_exclusive`): sources/plausible.py rejects and counts any other."""
    return field(default=None, metadata={"plausible": (low, high, low_exclusive)})


def each_within(low: float, high: float, low_exclusive: bool = False) -> Any:
    """A mapping Sample field (key -> value; empty: none supplied) whose every value is plausible as within()'s."""
    return field(default_factory=frozen_map, metadata={"plausible": (low, high, low_exclusive)})


# Plausible ranges are wide: they reject what no Instinct part can report (a gpu_metrics field the
# firmware filled with 0xFFFE, 65534 °C; a blob decoded with the wrong layout, 29179 W; 2^64-1 in a
# %llu file), not what is merely unusual. A lowest value excluded is one a sensor that read nothing
# gives (0 °C: a datacentre GPU is never at freezing) or that means "none" (a size or maximum of 0).
_POWER = 5000.0  # W per socket or GCD (MI355X is 1.4 kW)
_NODE_POWER = 100_000.0  # W per node: eight 1.4 kW sockets and their baseboard are ~12 kW
_POOL = 2.0**50  # 1 PiB: no memory pool is larger (GTT is host RAM)
_CLOCK = 1e10  # 10 GHz
_PCIE_RATE = 2e11  # PCIe 7 is 128 GT/s
_COUNT = 2.0**62


@dataclass(frozen=True, slots=True)
class Sample:
    """One read of one device. All values in SI base units; None/absent = not supplied.

    Each numeric field declares its plausible range here (within / each_within), and only here."""

    timestamp: float  # unix seconds at which the read finished
    # sensor ("edge", "junction", "memory", "hbm0".."hbm3", "vr_gfx", "vr_soc", "vr_mem") -> °C (150: past any shutdown)
    temperatures: Mapping[str, float] = each_within(0.0, 150.0, low_exclusive=True)
    # (sensor, threshold) -> °C, threshold in ("critical", "emergency")
    temperature_thresholds: Mapping[tuple[str, str], float] = each_within(0.0, 200.0, low_exclusive=True)
    power_watts: float | None = within(0.0, _POWER)
    power_cap_watts: float | None = within(0.0, _POWER)
    power_cap_max_watts: float | None = within(0.0, _POWER)
    # hardware accumulator, monotonic until driver reload (all-ones is already "not supplied")
    energy_joules: float | None = within(0.0, math.inf)
    busy: Mapping[str, float] = each_within(0.0, 1.0)  # engine -> ratio 0..1
    # MI300-class: XCC index within the device (a partition's own XCCs, from 0) -> instantaneous gfx busy
    xcc_busy: Mapping[int, float] = each_within(0.0, 1.0)
    # (engine, instance) -> busy ratio, engine "vcn" | "jpeg" (a partition's own decoders, from 0)
    media_engine_busy: Mapping[tuple[str, int], float] = each_within(0.0, 1.0)
    # (XCC, reason) -> seconds the XCC's gfx clock sat below the host's limit, cumulative; reason
    # "power" | "thermal" | "low_utilization" | "total" (any cause; causes may overlap)
    xcc_below_host_limit_seconds: Mapping[tuple[int, str], float] = each_within(0.0, math.inf)
    memory_used_bytes: Mapping[str, float] = each_within(0.0, _POOL)  # pool -> bytes
    memory_total_bytes: Mapping[str, float] = each_within(0.0, _POOL, low_exclusive=True)
    clocks_hertz: Mapping[str, float] = each_within(0.0, _CLOCK)  # domain -> Hz
    # MI200-class (gpu_metrics v1_0-v1_3 average_*clk_frequency): domain -> Hz, the SMU's average
    clocks_average_hertz: Mapping[str, float] = each_within(0.0, _CLOCK)
    clocks_max_hertz: Mapping[str, float] = each_within(0.0, _CLOCK, low_exclusive=True)
    clocks_min_hertz: Mapping[str, float] = each_within(0.0, _CLOCK)  # domain -> lowest DPM level, Hz
    # The gfx DPM table (pp_dpm_sclk) levels in Hz, lowest first; None when not read. A fine-grained
    # table (Aldebaran, MI300: min, the current clock when between, max) is held as its range (min, max).
    gfx_dpm_levels_hertz: tuple[float, ...] | None = None
    voltages_volts: Mapping[str, float] = each_within(0.0, 5.0)  # rail -> V
    throttle: Mapping[str, bool] = field(default_factory=frozen_map)  # reason -> active
    # MI300 (gpu_metrics v1_6+): reason -> seconds the firmware held the clocks back, cumulative
    throttle_residency_seconds: Mapping[str, float] = each_within(0.0, math.inf)
    memory_max_bandwidth_bytes_per_second: float | None = within(0.0, 1e14)  # the VRAM's peak (MI300: 5.3 TB/s)
    pcie_link_transfers_per_second: float | None = within(0.0, _PCIE_RATE)  # current, e.g. 16e9
    pcie_max_link_transfers_per_second: float | None = within(0.0, _PCIE_RATE)
    pcie_link_width: int | None = within(0.0, 32.0)
    pcie_max_link_width: int | None = within(0.0, 32.0)
    # measured (MI300: gpu_metrics pcie_bandwidth_inst); 1 TB/s is 8x a PCIe 6 x16 link
    pcie_bandwidth_bytes_per_second: float | None = within(0.0, 1e12)
    # MI200: an upper bound from pcie_bw (messages x max payload over the kernel's 1 s window), not a measurement
    pcie_bandwidth_upper_bound_bytes_per_second: float | None = within(0.0, 1e12)
    pcie_replays: int | None = within(0.0, _COUNT)
    pcie_recoveries: int | None = within(0.0, _COUNT)
    # MI300-class: how often the replay counter rolled over; recoveries the link partner started (u32)
    pcie_replay_rollovers: int | None = within(0.0, _COUNT)
    pcie_other_end_recoveries: int | None = within(0.0, 2.0**32)
    pcie_naks_sent: int | None = within(0.0, 2.0**32)
    pcie_naks_received: int | None = within(0.0, 2.0**32)
    # MI300-class (gpu_metrics v1_4+ gfxclk_lock_status, u32): a bit per gfx clock instance (XCC) whose clock is locked
    gfx_clock_lock_mask: int | None = within(0.0, 2.0**32)
    xgmi_link_width: int | None = within(0.0, 64.0)
    xgmi_link_speed_bytes_per_second: float | None = within(0.0, 2e12)
    xgmi_link_up: Mapping[int, bool] = field(default_factory=frozen_map)  # link index -> up
    xgmi_read_bytes: Mapping[int, float] = each_within(0.0, 2.0**74)  # cumulative, from u64 KB counters
    xgmi_write_bytes: Mapping[int, float] = each_within(0.0, 2.0**74)
    xgmi_error_events: int | None = within(0.0, _COUNT)  # accumulated by the source (the file clears on read)
    # (block, type) -> count, type in ("correctable", "uncorrectable", "deferred")
    ecc_errors: Mapping[tuple[str, str], int] = each_within(0.0, _COUNT)
    ras_retired_pages: int | None = within(0.0, 2.0**32)
    ras_pending_pages: int | None = within(0.0, 2.0**32)  # found bad, not yet retired (retired at the next reset)
    # The retired-page count at which the driver stops trusting the board's VRAM (the RMA point);
    # None when unknown or when the site disabled the check
    ras_bad_page_threshold: int | None = within(0.0, 2.0**32)
    cper_records: tuple[CperRecord, ...] = ()  # the records still in the driver's ring, oldest first
    last_reset_at: float | None = None  # unix seconds of the newest GPU reset the driver left evidence of
    # (port, severity) -> PCIe AER errors since boot; port "device" | "upstream" (the switch or root
    # port above it), severity "correctable" | "nonfatal" | "fatal"
    pcie_aer_errors: Mapping[tuple[str, str], int] = each_within(0.0, _COUNT)
    # MP1 13.0.12 parts (MI350X/MI355X), the board/ group: sensor -> °C of this GPU's own board
    # (gpuboard_temp: "retimer_x", "vddcr_vdd0", ...) and of the baseboard the node's GPUs share
    # (baseboard_temp: "ubb_fpga", ...); the node's power, its limit and the limit's ceiling (the
    # same figures on every GPU of the node) and whether node power management is on.
    board_temperatures: Mapping[str, float] = each_within(0.0, 150.0, low_exclusive=True)
    baseboard_temperatures: Mapping[str, float] = each_within(0.0, 150.0, low_exclusive=True)
    node_power_watts: float | None = within(0.0, _NODE_POWER)
    node_power_limit_watts: float | None = within(0.0, _NODE_POWER)
    node_power_limit_max_watts: float | None = within(0.0, _NODE_POWER)
    node_power_management_enabled: bool | None = None
    # the baseboard's own power (its GPUs included) and its threshold: board/baseboard_power(_limit)
    baseboard_power_watts: float | None = within(0.0, _NODE_POWER)
    baseboard_power_limit_watts: float | None = within(0.0, _NODE_POWER)
    # (file, reason) -> how many times this read found the file unreadable or its value rejected
    # (file = the attribute's name, "temp2_input"; reason one of the set in exporter/sources/errors.py)
    file_errors: Mapping[tuple[str, str], int] = field(default_factory=frozen_map)


# The Sample fields that are mappings (key -> value), the others being scalars (None: not supplied).
SAMPLE_MAPPINGS = frozenset(f.name for f in fields(Sample) if f.default_factory is not MISSING)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """A device as the poller last saw it: identity, latest good sample, and whether it is up."""

    identity: DeviceIdentity
    gpu: int  # the `gpu` label: given once per device key, never changed while the process runs
    sample: Sample | None  # the latest sample that was read in full; None before the first
    up: bool
    down_reason: str = ""  # "timeout" | "stuck" | "gone" | "read_error" | ... when not up
    read_errors: Mapping[str, int] = field(default_factory=frozen_map)  # reason -> total
    read_timeouts: int = 0
    present: bool = True  # False once a discovery no longer finds the device (down_reason "gone")
    file_errors: Mapping[tuple[str, str], int] = field(default_factory=frozen_map)  # (file, reason) -> total
    # The link's theoretical one-direction bandwidth at the sample's speed and width (pipeline/pcie.py)
    pcie_link_max_bytes_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class AlertState:
    """One in-daemon alert on one device (see alerting/state.py).

    Keyed by (device_key, alert): the device's DeviceIdentity.key, so nothing that renumbers `gpu`
    could ever move an alert to another physical GPU.
    """

    gpu: int
    alert: str
    severity: str
    firing: bool
    since: float  # unix seconds of the last transition
    # The last value evaluated; an inactive state is not rebuilt every cycle, so there it is the value
    # of its last change (alerting/state.py keeps the work per cycle in proportion to what fires).
    value: float | None = None
    pending_since: float | None = None  # monotonic seconds
    clock_down_ratio: float = 0.0  # total suggested reduction of the gfx clock ceiling, 0..1
    suggested_gfx_clock_max_hertz: float | None = None
    suggestion: str = ""  # human sentence (with the command in it); always a suggestion, never applied
    suggested_command: str = ""  # the shell command of the suggestion, "" when it has none
    undo_command: str = ""  # the one command that undoes a suggested clock ceiling, while one is advised
    # After a clock-down alert resolved: since when the value has stayed on the cool side of the clear
    # threshold; the restore advice (suggestion, undo_command) stays until restore_after has passed.
    cool_since: float | None = None
    # Clock-down bookkeeping (alerting/state.py): steps are fractions of the gfx clock max seen when the alert
    # fired, so an operator applying a suggestion does not make the next step compound on it.
    reference_gfx_clock_max_hertz: float | None = None
    clock_down_stepped_at: float | None = None  # monotonic seconds of the last clock-down step
    device_key: tuple[str, str, int] = ("", "", 0)  # DeviceIdentity.key of the device


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """One failing health check of one GPU (alerting/verdict.py): the evidence, in words, and its age."""

    check: str  # "ecc_uncorrectable", "device_down", ... (docs/health.md)
    severity: str  # "warning" | "critical"
    reason: str  # the evidence, for a human: what was read and which threshold it crossed
    since: float  # unix seconds since which it fails (the evidence's own time where it has one)


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """The verdict on one GPU: fit when no check fails, with what the next cycle's verdict needs.

    `counters`, `held`, `residency`, `last_counts` and `first_seen` are the stage's memory
    (alerting/verdict.py), carried from one cycle to the next and never shown: the thinned history of
    each counter the checks watch, since when each held condition has held, the throttle residencies
    of the last cycle, each counted key's last good count, when untimed evidence was first seen.
    """

    gpu: int
    device_key: tuple[str, str, int]
    checks: tuple[HealthCheck, ...] = ()  # the failing checks, by name
    counters: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=frozen_map)  # (monotonic, value)
    held: Mapping[str, tuple[float, float]] = field(default_factory=frozen_map)  # condition -> (monotonic, unix) since
    residency: Mapping[str, float] = field(default_factory=frozen_map)
    # check -> key -> the last good count of one RAS block or AER port (kept while it is unreadable)
    last_counts: Mapping[str, Mapping[str, float]] = field(default_factory=frozen_map)
    # evidence with no usable time of its own (a CPER record without a valid or with a future timestamp,
    # a reset dated ahead) -> unix seconds it was first seen: its age counts from there
    first_seen: Mapping[str, float] = field(default_factory=frozen_map)

    @property
    def fit(self) -> bool:
        return not self.checks


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    """Every GPU's verdict of one cycle and what an operator could run about it (the daemon never does).

    The commands take the node out of service while a GPU is unfit (Slurm: drain; Kubernetes: a
    NoSchedule taint) and put it back (resume, untaint). The undo commands stay for `advice_for`
    after the last unfit verdict, as the clock-down restore advice does.
    """

    taken_at: float = 0.0
    node: str = ""
    gpus: tuple[GpuHealth, ...] = ()
    suggestion: str = ""  # one sentence: what is unfit and what to run; "" when nothing is advised
    drain_command: str = ""  # Slurm
    resume_command: str = ""
    # the drain command's reason as given to Slurm ("amdgpu-exporter: gpu 0: ecc_uncorrectable"): what the
    # Slurm action mode (exporter/actions/) drains with; "" when no drain is advised
    drain_reason: str = ""
    taint_command: str = ""  # Kubernetes
    untaint_command: str = ""
    unfit_at: float | None = None  # unix seconds of the newest verdict with an unfit GPU

    @property
    def fit(self) -> bool:
        """Every GPU is fit, and there is at least one: a node whose GPUs are not seen is not fit."""
        return bool(self.gpus) and all(gpu.fit for gpu in self.gpus)


@dataclass(frozen=True, slots=True)
class SourceStats:
    """Counters a source keeps about itself, reported as data with every snapshot."""

    worker_restarts: int | None = None  # rocm-smi worker processes started after the first; None: no worker


POLL_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Sampler cycles: a healthy cycle of 16 GCDs is ~0.1-1 ms; the top buckets catch slow devices.
SAMPLER_CYCLE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations counted into buckets; observe() returns a new value, so a published one never changes."""

    bounds: tuple[float, ...] = POLL_DURATION_BUCKETS  # upper bounds; +Inf is implied
    counts: tuple[int, ...] = (0,) * (len(POLL_DURATION_BUCKETS) + 1)  # per bucket (not cumulative), +Inf last
    total: float = 0.0  # sum of the observations

    def observe(self, value: float) -> Histogram:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        counts = tuple(c + 1 if i == index else c for i, c in enumerate(self.counts))
        return Histogram(self.bounds, counts, self.total + value)

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class WindowStat:
    """min / max / mean of one value over the sliding window."""

    minimum: float
    maximum: float
    mean: float
    exact_mean: bool = False  # the mean came from a firmware accumulator, not from the samples


@dataclass(frozen=True, slots=True)
class DeviceWindow:
    """One device's window: (family, key) -> stat for every value supplied in it.

    family is "temperature" | "power" | "busy" | "clock"; key the sensor, "socket", engine, domain.
    """

    gpu: int
    samples: int  # sampler samples inside the window
    stats: Mapping[tuple[str, str], WindowStat] = field(default_factory=frozen_map)


@dataclass(frozen=True, slots=True)
class SamplerStats:
    """The sampler's own counters, copied out when a window snapshot is taken."""

    samples: Mapping[int, int] = field(default_factory=frozen_map)  # gpu -> samples since start
    read_errors: Mapping[tuple[int, str], int] = field(default_factory=frozen_map)  # (gpu, reason) -> count
    cycle_durations: Histogram = Histogram(SAMPLER_CYCLE_BUCKETS, (0,) * (len(SAMPLER_CYCLE_BUCKETS) + 1))


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """Every device's sliding window at one instant (pipeline/windows.py), whoever scrapes."""

    monotonic_at: float  # time.monotonic() of the instant the windows end at
    window_seconds: float
    interval_seconds: float
    devices: tuple[DeviceWindow, ...] = ()
    stats: SamplerStats = SamplerStats()


# --- who is on each device (attribution): what its sources report and what the enrich stage adds ---


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What matching needs to know about one device of the snapshot."""

    gpu: int  # the `gpu` label
    pci_bus_id: str  # lower-case BDF
    partition: int = 0  # compute partition index on its socket (0 for a whole GPU)
    xcp: int | None = None  # N of the amdgpu_xcp_N platform device holding a partition > 0
    card: int | None = None  # DRM card index (cardN)
    render_minor: int | None = None  # renderD minor (128...)


@dataclass(frozen=True, slots=True)
class ByBdf:
    """A whole GPU or its partition 0, named by its PCI function."""

    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class ByXcp:
    """A partition > 0, named by its platform device amdgpu_xcp_N."""

    xcp: int


@dataclass(frozen=True, slots=True)
class ByDrm:
    """A device named by its DRM minors (AMD's DRA driver: gpu-<card>-<renderD>)."""

    card: int
    render_minor: int | None = None


@dataclass(frozen=True, slots=True)
class ByPhysicalIndex:
    """The n-th physical GPU in PCI BDF order, partition 0 (DRA auto-partition: gpu-<n>-<cpx>-<nps4>)."""

    index: int


@dataclass(frozen=True, slots=True)
class ByGpuIndex:
    """The device with this `gpu` label (Slurm gres index: rocm-smi's order, as is `gpu`)."""

    gpu: int


@dataclass(frozen=True, slots=True)
class ByLocation:
    """A device by PCI function and partition (KFD topology: location_id + domain)."""

    pci_bus_id: str
    partition: int


DeviceName = ByBdf | ByXcp | ByDrm | ByPhysicalIndex | ByGpuIndex | ByLocation


@dataclass(frozen=True, slots=True)
class Claim:
    """One holder of one device, as a source reports it. `labels` are the holder's attribution labels."""

    device: DeviceName
    device_id: str  # the device as the source spelled it, for logs and the allocation series
    labels: tuple[tuple[str, str], ...] = ()  # (name, value) pairs, hashable so claims can be diffed
    resource: str = ""  # "amd.com/gpu", "gpu.amd.com" (DRA driver), "slurm"


@dataclass(frozen=True, slots=True)
class AttributionReport:
    """The latest result of one attribution source: immutable, replaced wholesale on each read."""

    source: str  # "kubernetes" | "slurm"
    up: bool  # the last read succeeded (within its deadline)
    claims: tuple[Claim, ...] = ()
    taken_at: float = 0.0
    error: str = ""  # one line, "" when up


@dataclass(frozen=True, slots=True)
class Allocation:
    """A claim matched to a device of the snapshot."""

    gpu: int
    source: str
    device_id: str
    resource: str
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process on one of the snapshot's devices (from the KFD's per-process files)."""

    gpu: int
    pid: int
    comm: str
    vram_bytes: int | None
    sdma_seconds: float | None
    cu_occupancy: int | None  # compute units its waves occupy
    cu_occupancy_ratio: float | None = None  # of the device's compute units, 0..1


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who is on each device: what the enrich stage adds to a snapshot. Immutable.

    `label_names` are fixed by configuration (pod/namespace/container with --kubernetes, job_id/
    job_user/job_partition with --slurm.state-dir), so every per-GPU series keeps one label set;
    `labels[gpu]` holds their values in that order ("" where the device is not allocated).
    """

    label_names: tuple[str, ...] = ()
    labels: Mapping[int, tuple[str, ...]] = field(default_factory=frozen_map)
    allocations: tuple[Allocation, ...] = ()
    processes: tuple[ProcessUsage, ...] = ()
    sources_up: Mapping[str, bool] = field(default_factory=frozen_map)  # source -> its last read succeeded

    def values_for(self, gpu: int) -> tuple[str, ...]:
        return self.labels.get(gpu) or ("",) * len(self.label_names)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Immutable result of one poll cycle: what alerting, exposition and the API all read.

    `windows` is the sampler's window snapshot taken when the cycle was published (None with
    --fast.interval=0): the pipeline joins it to the poll's snapshot before any later stage runs.
    """

    taken_at: float  # unix seconds: what is shown
    devices: tuple[DeviceState, ...] = ()
    monotonic_at: float = 0.0  # time.monotonic() at the same instant: what durations are measured on
    poll_duration_seconds: float = 0.0
    source: str = ""  # "sysfs" | "rocm-smi"
    cycle: int = 0
    source_stats: SourceStats = SourceStats()
    # Who is on each device (pods, jobs, processes): added by the enrich stage, empty when attribution is off.
    attribution: Attribution = field(default_factory=Attribution)
    windows: WindowSnapshot | None = None
    discoveries: int = 0  # discoveries merged so far
    discovery_failures: int = 0  # discoveries that failed or overran their deadline


@dataclass(frozen=True, slots=True)
class AlertmanagerStats:
    """The Alertmanager pusher's counters (one per alert per post)."""

    sent: int = 0
    failed: int = 0
    sender_failures: int = 0  # sender tasks that died (and were restarted)
    sender_failing: bool = False  # a sender died and has not completed a pass since


# Every reason the exporter drains a node with starts with this: the mark by which the Slurm action mode
# (exporter/actions/) tells its own drains from an administrator's, and resumes only its own.
DRAIN_MARKER = "amdgpu-exporter:"

ACTIONS = ("drain", "resume")
# done: the command succeeded; dry_run: it would have run (--action.slurm=dry-run); refused_share: the
# drain would take more than the allowed share of a partition out of service; refused_foreign: the node
# is drained with a reason not the exporter's (an administrator's), which it never resumes;
# rate_limited: the allowed number of actions per interval is spent; failed: the command or a query
# before it failed, timed out or is missing.
ACTION_OUTCOMES = ("done", "dry_run", "refused_share", "refused_foreign", "rate_limited", "failed")


@dataclass(frozen=True, slots=True)
class ActionStats:
    """What the Slurm action mode did so far (exporter/actions/slurm.py), copied into each cycle's stats."""

    mode: str = "off"  # off | dry-run | on
    counts: Mapping[tuple[str, str], int] = field(default_factory=frozen_map)  # (action, outcome) -> count
    drained: bool | None = None  # the node is drained as far as the mode knows (None: not asked yet)


DEVICE_PLUGIN_METHODS = ("List", "GetGPUState")  # the MetricsService calls answered (SetError is not)


@dataclass(frozen=True, slots=True)
class DevicePluginStats:
    """The device-plugin health service's counters (exporter/web/device_plugin.py), copied into each cycle."""

    calls: Mapping[str, int] = field(default_factory=frozen_map)  # method -> calls answered


@dataclass(frozen=True, slots=True)
class ProcessStats:
    """The exporter process itself, read once per cycle from Linux /proc (pipeline/process.py)."""

    values: Mapping[str, float] = field(default_factory=frozen_map)  # process_* sample name -> value


@dataclass(frozen=True, slots=True)
class HostInfo:
    """The host's software versions, read at start (exporter/sources/host.py): what Grafana
    correlates incidents with. "" / () where not found."""

    kernel_release: str = ""
    driver_version: str = ""  # amdgpu module version; "" for the in-tree driver
    driver_initstate: str = ""  # "live" once the module has loaded
    ppfeaturemask: str = ""  # "0xfff7bfff"
    rocm: tuple[tuple[str, str], ...] = ()  # (install folder, version)
    smi_libraries: tuple[tuple[str, str], ...] = ()  # (library, version), only those that answered


@dataclass(frozen=True, slots=True)
class WebStats:
    """The HTTP layer's counters, copied once per cycle; only with --web.config.file."""

    config_reload_successes: int = 0
    config_reload_failures: int = 0
    config_last_reload_ok: bool = True
    rejections: tuple[tuple[str, int], ...] = ()  # (reason, count), every known reason
    open_connections: int = 0
    max_connections: int = 0


STAGES = (
    "rules",
    "health",
    "render",
    "alertmanager",
    "accounting",
)  # the stages whose failures fail readiness (pipeline/readiness.py)


@dataclass(frozen=True, slots=True)
class ExporterStats:
    """What the exporter reports about itself besides the snapshot."""

    source: str = ""
    source_reason: str = ""
    poll_durations: Histogram = Histogram()
    alertmanager: AlertmanagerStats | None = None  # None when no Alertmanager is configured
    process: ProcessStats = ProcessStats()  # empty where /proc cannot be read
    host: HostInfo | None = None  # None until read (or where it is not: tests, benchmarks)
    stage_failures: Mapping[str, int] = field(default_factory=frozen_map)  # stage -> failures so far
    failing_stages: tuple[str, ...] = ()  # stages whose latest run failed ("rules", "render", "alertmanager")
    web: WebStats | None = None  # None without --web.config.file
    reloads: Mapping[tuple[str, str], int] = field(default_factory=frozen_map)  # (config|rules, result) -> count
    actions: ActionStats | None = None  # None with --action.slurm=off
    device_plugin: DevicePluginStats | None = None  # None without --device-plugin.socket


@dataclass(frozen=True, slots=True)
class Published:
    """What one cycle publishes: the (enriched) snapshot, the alerts and the health verdict evaluated on
    it, the exporter's stats.

    Made once per cycle by exporter.cycle and only read after: by exposition and the web.
    """

    snapshot: Snapshot
    alerts: tuple[AlertState, ...] = ()
    stats: ExporterStats = ExporterStats()
    health: HealthVerdict = HealthVerdict()  # the health verdict on the same snapshot (beside the alerts)
    jobs: tuple[JobUsage, ...] = ()  # the jobs and pods running on this cycle's devices, as accounted so far


# --- what each job or pod used (exporter/accounting/): accumulated from cycle to cycle, carried on ---


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """What one job used of one device while it held it (exporter/accounting/ledger.py).

    Energy is the job's share of its package's energy counter (docs/accounting.md: an MI250X's two
    dies and an MI300X's partitions share one counter, split by busy-seconds); the temperatures of a
    partition > 0 are its socket's (read on partition 0). `history` is the thinned (unix seconds,
    power W, gfx busy 0..1, junction °C) of the job's lifetime, for the report's plots.
    """

    gpu: int
    device_key: tuple[str, str, int]
    package: str = ""
    die: int = 0
    partition: int = 0
    product: str = ""
    place: str = ""  # "die 1", "partition 3"; "" for a whole GPU
    held_seconds: float = 0.0
    energy_joules: float = 0.0
    package_energy_joules: float = 0.0  # the whole package's counter increase while held (the share's base)
    busy_seconds: Mapping[str, float] = field(default_factory=frozen_map)  # engine ("gfx", "memory") -> s
    peak_power_watts: float | None = None  # the highest of the job's share over one cycle
    peak_temperatures_celsius: Mapping[str, float] = field(default_factory=frozen_map)  # "junction", "memory"
    vram_peak_bytes: float | None = None
    throttled_seconds: Mapping[str, float] = field(default_factory=frozen_map)  # reason -> s
    errors: Mapping[str, int] = field(default_factory=frozen_map)  # counter ("ecc_uncorrectable", ...) -> increase
    failed_checks: tuple[str, ...] = ()  # health checks (docs/health.md) that failed while held
    history: tuple[tuple[float, float | None, float | None, float | None], ...] = ()
    history_stride: int = 1  # cycles per history point (doubled each time the history is full)
    history_skipped: int = 0  # cycles since the last point kept


@dataclass(frozen=True, slots=True)
class JobUsage:
    """One job (Slurm, Flux, PBS) or pod, from the first cycle that saw it hold a device to the first
    that no longer did (`ended_at`, None while it runs)."""

    job_id: str  # the scheduler's job id; a pod's "namespace/name"
    scheduler: str  # "slurm" | "flux" | "pbs" | "kubernetes"
    labels: tuple[tuple[str, str], ...] = ()  # the holder's attribution labels (job_user, pod, ...)
    started_at: float = 0.0  # unix seconds of the first cycle that saw it
    ended_at: float | None = None
    updated_at: float = 0.0  # unix seconds of the last cycle accounted
    devices: tuple[DeviceUsage, ...] = ()
    held_gpus: tuple[int, ...] = ()  # the gpus it holds now (() once ended)

    @property
    def energy_joules(self) -> float:
        return sum(d.energy_joules for d in self.devices)

    @property
    def gpu_seconds(self) -> float:
        return sum(d.held_seconds for d in self.devices)
