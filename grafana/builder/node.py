"""AMD GPU / Node and GCD detail: one node's GCDs, one function per row of the dashboard."""

from __future__ import annotations

from .memory_limits import MEMORY_WARNING_RATIO, MemoryLimits, mebibytes, promql_number
from .panels import (
    ANY_IS_BAD,
    ANY_IS_WORTH_A_LOOK,
    GREEN,
    NODE_UID,
    ORANGE,
    RED,
    UP_DOWN_MAPPING,
    UP_DOWN_STEPS,
    VRAM_STEPS,
    Dashboard,
    Panel,
    Query,
    Row,
    against_reference,
    celsius,
    temperature_steps,
)
from .queries import (
    CORE_SENSORS,
    HBM_SENSORS,
    JOULES_PER_KWH,
    NODE,
    NODE_ALL_GPUS,
    NODE_PACKAGE_CAP,
    NODE_PACKAGE_POWER,
    PER_GPU,
    age_at_scrape,
    exporter_process,
    fast_cycle_quantile,
    junction,
    node_package,
    only_exporter,
    package_join,
    packages_of_selected_gpus,
    per_step,
    poll_duration_quantile,
    vram_used_ratio,
)
from .render import DATASOURCE
from .thresholds import (
    PCIE_EFFICIENCY_TARGET_RATIO,
    RETIRED_PAGES_CRITICAL,
    TEMPERATURE_SWING_LIMIT_CELSIUS,
    Thresholds,
)
from .variables import datasource_variable, query_variable


def overview_row(t: Thresholds) -> Row:
    return Row(
        "Overview",
        (
            Panel(
                "stat",
                "Up",
                "Whether the exporter's last read of each selected GCD succeeded within its deadline.",
                Query(f"amdgpu_up{{{NODE}}}", PER_GPU),
                unit="none",
                width=4,
                height=5,
                mappings=(UP_DOWN_MAPPING,),
                steps=UP_DOWN_STEPS,
                options={"colorMode": "background", "graphMode": "none"},
            ),
            Panel(
                "stat",
                "Junction temperature",
                f"Junction (hotspot) temperature now; red from {celsius(t.junction_hot_celsius)}.",
                Query(junction(NODE), PER_GPU),
                unit="celsius",
                width=5,
                height=5,
                steps=temperature_steps(t),
            ),
            Panel(
                "stat",
                "Package power",
                "Socket power of each package holding a selected GCD (MI250X: measured on die 0 for both).",
                Query(NODE_PACKAGE_POWER, "package {{package}}"),
                unit="watt",
                width=5,
                height=5,
            ),
            Panel(
                "gauge",
                "GFX busy",
                "Share of time the gfx (compute) engine was busy.",
                Query(f'amdgpu_busy_ratio{{{NODE}, engine="gfx"}}', PER_GPU),
                unit="percentunit",
                width=5,
                height=5,
                minimum=0,
                maximum=1,
            ),
            Panel(
                "gauge",
                "VRAM used",
                "VRAM in use as a share of VRAM size.",
                Query(vram_used_ratio(NODE), PER_GPU),
                unit="percentunit",
                width=5,
                height=5,
                minimum=0,
                maximum=1,
                steps=VRAM_STEPS,
            ),
            Panel(
                "table",
                "Device identity",
                "What each selected GCD is: PCI address, product, package and die, serial, VBIOS, driver and "
                "partition modes (amdgpu_device_info).",
                f"amdgpu_device_info{{{NODE}}}",
                unit="none",
                width=24,
                height=6,
                hide_columns=("job", "instance", "Value"),
            ),
        ),
    )


def sensor_temperatures(t: Thresholds, title: str, description: str, sensors: str) -> Panel:
    """The selected sensors (solid) against the device's own limits for them (dashed) and the alert level."""
    return Panel(
        "timeseries",
        title,
        f"{description}; the red band starts at {celsius(t.junction_hot_celsius)}.",
        (
            Query(f"amdgpu_temperature_celsius{{{NODE}, {sensors}}}", "gpu {{gpu}} {{sensor}}"),
            Query(
                f"amdgpu_temperature_threshold_celsius{{{NODE}, {sensors}}}",
                "gpu {{gpu}} {{sensor}} {{threshold}} limit",
            ),
        ),
        unit="celsius",
        width=12,
        height=9,
        steps=temperature_steps(t),
        threshold_line=True,
        dashed=("B",),
    )


def thermals_row(t: Thresholds) -> Row:
    return Row(
        "Temperatures and throttling",
        (
            sensor_temperatures(
                t,
                "GPU temperatures",
                "Edge, junction (hotspot) and voltage-regulator sensors (solid) with the device's own "
                "critical/emergency limits (dashed)",
                CORE_SENSORS,
            ),
            sensor_temperatures(
                t,
                "Memory (HBM) temperatures",
                "HBM stack sensors (memory = hottest stack, hbm0..3 per stack) with the device's memory limits "
                "(dashed)",
                HBM_SENSORS,
            ),
            Panel(
                "timeseries",
                "Junction temperature over the window (min / max)",
                "Lowest and highest junction temperature of each GCD within the exporter's sliding window "
                "(amdgpu_exporter_window_seconds, 15 s by default), sampled every 100 ms: a spike between two "
                f"scrapes shows here; the red band starts at {celsius(t.junction_hot_celsius)}.",
                Query(
                    f'amdgpu_temperature_window_celsius{{{NODE}, sensor="junction", stat=~"min|max"}}',
                    "gpu {{gpu}} {{stat}}",
                ),
                unit="celsius",
                width=12,
                height=8,
                steps=temperature_steps(t),
                threshold_line=True,
            ),
            Panel(
                "timeseries",
                "Junction swing within the window",
                "Junction window max - min per GCD. Training engineers expect less than "
                f"{celsius(TEMPERATURE_SWING_LIMIT_CELSIUS)} during communication bursts (dashed line; the "
                "AMDGPUTemperatureSwing alert fires on a sustained swing above it).",
                Query(
                    f'amdgpu_temperature_window_celsius{{{NODE}, sensor="junction", stat="max"}} - ignoring (stat) '
                    f'amdgpu_temperature_window_celsius{{{NODE}, sensor="junction", stat="min"}}',
                    PER_GPU,
                ),
                # a difference of temperatures, not a temperature: no hot/cool levels apply
                unit="suffix: °C",
                width=12,
                height=8,
                minimum=0,
                steps=((TEMPERATURE_SWING_LIMIT_CELSIUS, RED),),
                threshold_line=True,
            ),
            Panel(
                "stat",
                "GCDs throttling now",
                "How many of the selected GCDs have at least one SMU throttler reason active.",
                f"sum(max by (gpu) (amdgpu_throttle_active{{{NODE}}}))",
                unit="none",
                width=4,
                height=8,
                steps=ANY_IS_WORTH_A_LOOK,
            ),
            Panel(
                "status-history",
                "Throttle reasons active in the range",
                "For each SMU throttler reason that was active at some point in the range, how many of the "
                "selected GCDs had it active (0 = none). Reasons never active are left out: there are ~34.",
                Query(
                    f"sum by (reason) (amdgpu_throttle_active{{{NODE}}}) and on(reason) "
                    f"max by (reason) (max_over_time(amdgpu_throttle_active{{{NODE}}}[$__range])) > 0",
                    "{{reason}}",
                ),
                unit="none",
                width=20,
                height=8,
                steps=ANY_IS_BAD,
                options={"showValue": "auto"},
                may_be_empty="no GCD throttled in the range",
            ),
            Panel(
                "timeseries",
                "Time held back per throttler (MI300)",
                "Share of time the firmware held a socket's clocks back, by reason (prochot, ppt, socket_thermal, "
                "vr_thermal, hbm_thermal), from the gpu_metrics v1_6+ residency counters.",
                Query(
                    f"rate(amdgpu_throttle_residency_seconds_total{{{NODE}}}[$__rate_interval]) > 0",
                    "gpu {{gpu}} {{reason}}",
                ),
                unit="percentunit",
                width=24,
                height=8,
                may_be_empty="only MI300-class gpu_metrics v1_6+ has residency counters; none throttled in the range",
            ),
        ),
    )


def power_row() -> Row:
    energy_in_range = package_join(f"increase(amdgpu_energy_joules_total{{{NODE_ALL_GPUS}}}[$__range])", NODE_ALL_GPUS)
    return Row(
        "Power and energy",
        (
            against_reference(
                "Package power and cap",
                "Socket power of each package holding a selected GCD (solid), its current cap (dashed) and the "
                "highest cap allowed (dotted). MI250X: die 0 measures the whole package.",
                Query(NODE_PACKAGE_POWER, "package {{package}} power"),
                Query(NODE_PACKAGE_CAP, "package {{package}} cap"),
                unit="watt",
                width=12,
                second_reference=Query(
                    node_package("amdgpu_power_cap_max_watts", "max"), "package {{package}} cap max"
                ),
            ),
            Panel(
                "timeseries",
                "Energy rate",
                "Average power derived from the hardware energy counter (rate of amdgpu_energy_joules_total) "
                "per package: smoother than the sampled power and immune to missed samples.",
                Query(
                    packages_of_selected_gpus(
                        package_join(per_step("rate", "amdgpu_energy_joules_total", NODE_ALL_GPUS), NODE_ALL_GPUS)
                    ),
                    "package {{package}}",
                ),
                unit="watt",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Power over the window (min / mean / max)",
                "Socket power of each GCD within the exporter's sliding window, sampled every 100 ms: the gap "
                "between max and min is the compute / communication swing a 15 s scrape cannot see. The mean "
                "comes from the energy accumulator, exact whatever the sampling. MI250X: die 0 only.",
                Query(f"amdgpu_power_window_watts{{{NODE}}}", "gpu {{gpu}} {{stat}}"),
                unit="watt",
                width=24,
                height=7,
                minimum=0,
                may_be_empty="an MI250X measures its package on die 0: die 1 has no power",
            ),
            Panel(
                "stat",
                "Energy in range",
                "Energy each package holding a selected GCD used over the dashboard's time range.",
                Query(f"({packages_of_selected_gpus(energy_in_range)}) / {JOULES_PER_KWH}", "package {{package}}"),
                unit="kwatth",
                width=4,
            ),
        ),
    )


def busy_row() -> Row:
    return Row(
        "Utilisation",
        (
            Panel(
                "timeseries",
                "GFX and memory busy (waveform)",
                "Raw gfx (compute) and memory (HBM controller) busy samples, not averaged, so the compute / "
                "communication waveform of a training step is visible: gfx high while computing, dropping "
                "during all-reduce. Zoom to a few minutes to see single steps.",
                Query(f'amdgpu_busy_ratio{{{NODE}, engine=~"gfx|memory"}}', "gpu {{gpu}} {{engine}}"),
                unit="percentunit",
                width=16,
                height=9,
                minimum=0,
                maximum=1,
                interval="1s",
                custom={"lineInterpolation": "stepAfter", "fillOpacity": 0},
                options={"maxDataPoints": 2000},
            ),
            Panel(
                "timeseries",
                "GFX busy over the window (min / mean / max)",
                "Lowest, mean and highest gfx busy of each GCD within the exporter's sliding window, sampled "
                "every 100 ms. A training job alternating compute and communication shows max near 1 and min "
                "far below it at every scrape; max and min close together mean steady load (or none). MI300: "
                "the mean comes from the firmware's activity accumulator.",
                Query(f'amdgpu_busy_window_ratio{{{NODE}, engine="gfx"}}', "gpu {{gpu}} {{stat}}"),
                unit="percentunit",
                width=16,
                height=8,
                minimum=0,
                maximum=1,
            ),
            Panel(
                "timeseries",
                "Memory busy over the window",
                "Memory (HBM controller) busy within the window: min, mean and max per GCD.",
                Query(f'amdgpu_busy_window_ratio{{{NODE}, engine="memory"}}', "gpu {{gpu}} {{stat}}"),
                unit="percentunit",
                width=8,
                height=8,
                minimum=0,
                maximum=1,
            ),
            Panel(
                "timeseries",
                "Busy averaged per step (all engines)",
                "gfx, memory and media busy averaged over each step: sustained load rather than the waveform.",
                Query(f"avg_over_time(amdgpu_busy_ratio{{{NODE}}}[$__rate_interval])", "gpu {{gpu}} {{engine}}"),
                unit="percentunit",
                width=8,
                height=9,
                minimum=0,
                maximum=1,
            ),
        ),
    )


def memory_row() -> Row:
    return Row(
        "Memory",
        (
            against_reference(
                "VRAM and GTT",
                "Memory in use by pool (vram, visible_vram, gtt; solid) against the pool size (dashed).",
                Query(f"amdgpu_memory_used_bytes{{{NODE}}}", "gpu {{gpu}} {{pool}} used"),
                Query(f"amdgpu_memory_total_bytes{{{NODE}}}", "gpu {{gpu}} {{pool}} total"),
                unit="bytes",
                width=24,
            ),
        ),
    )


def clocks_row() -> Row:
    return Row(
        "Clocks and voltage",
        (
            against_reference(
                "Clocks vs max",
                "Current clock per domain (solid) and the highest DPM level of that domain (dashed).",
                Query(f"amdgpu_clock_hertz{{{NODE}}}", "gpu {{gpu}} {{domain}}"),
                Query(f"amdgpu_clock_max_hertz{{{NODE}}}", "gpu {{gpu}} {{domain}} max"),
                unit="hertz",
                width=10,
            ),
            Panel(
                "timeseries",
                "GFX clock / max",
                "The gfx clock as a share of its ceiling: below 1 under load means a power or thermal limit.",
                Query(
                    f'amdgpu_clock_hertz{{{NODE}, domain="gfx"}} / amdgpu_clock_max_hertz{{{NODE}, domain="gfx"}}',
                    PER_GPU,
                ),
                unit="percentunit",
                width=7,
                minimum=0,
                maximum=1.05,
            ),
            Panel(
                "timeseries",
                "Voltages",
                "Voltage by rail (gfx, soc, memory) where the device reports it.",
                Query(f"amdgpu_voltage_volts{{{NODE}}}", "gpu {{gpu}} {{rail}}"),
                unit="volt",
                may_be_empty="MI300X reports no voltages; MI200 reports vddgfx (hwmon in0_input) only",
                width=7,
            ),
            Panel(
                "timeseries",
                "GFX clock over the window (min / max)",
                "Lowest and highest gfx clock of each GCD within the exporter's sliding window, sampled every "
                "100 ms: a clock that dips between scrapes (a power or thermal limit biting briefly) shows as "
                "a min below the max.",
                Query(f'amdgpu_clock_window_hertz{{{NODE}, domain="gfx", stat=~"min|max"}}', "gpu {{gpu}} {{stat}}"),
                unit="hertz",
                width=24,
                height=7,
            ),
        ),
    )


def pcie_row() -> Row:
    return Row(
        "PCIe",
        (
            against_reference(
                "PCIe link speed",
                "Current link speed (solid) against the maximum the device supports (dashed). Idle links may "
                "train down to save power; a link that stays slow under load is a problem.",
                Query(f"amdgpu_pcie_current_link_transfers_per_second{{{NODE}}} / 1e9", "gpu {{gpu}} current"),
                Query(f"amdgpu_pcie_max_link_transfers_per_second{{{NODE}}} / 1e9", "gpu {{gpu}} max"),
                unit="suffix:GT/s",
                width=6,
            ),
            against_reference(
                "PCIe link width",
                "Current link width in lanes (solid) against the maximum (dashed): narrower means a seating "
                "or riser problem.",
                Query(f"amdgpu_pcie_current_link_width{{{NODE}}}", "gpu {{gpu}} current"),
                Query(f"amdgpu_pcie_max_link_width{{{NODE}}}", "gpu {{gpu}} max"),
                unit="prefix:x",
                width=6,
            ),
            against_reference(
                "PCIe bandwidth",
                "PCIe traffic against the current link's theoretical bandwidth in one direction (dashed; "
                "amdgpu_pcie_link_max_bytes_per_second: GT/s x lanes x line-code efficiency / 8). Solid: measured "
                "(MI300, gpu_metrics); dotted: MI200's upper-bound estimate from pcie_bw (messages x max payload).",
                Query(f"amdgpu_pcie_bandwidth_bytes_per_second{{{NODE}}}", "gpu {{gpu}} measured"),
                Query(f"amdgpu_pcie_link_max_bytes_per_second{{{NODE}}}", "gpu {{gpu}} link max"),
                unit="Bps",
                width=6,
                second_reference=Query(
                    f"amdgpu_pcie_bandwidth_upper_bound_bytes_per_second{{{NODE}}}", "gpu {{gpu}} upper bound"
                ),
                may_be_empty="MI200 has no measured bandwidth and MI300 no pcie_bw estimate",
            ),
            Panel(
                "timeseries",
                "PCIe bandwidth / theoretical",
                "PCIe traffic as a share of the link's theoretical bandwidth (the recording rules "
                "gpu:amdgpu_pcie_bandwidth_efficiency:ratio and gpu:amdgpu_pcie_bandwidth_upper_bound_efficiency"
                f":ratio). Host-device transfers of a training job should reach "
                f"{PCIE_EFFICIENCY_TARGET_RATIO:.0%} (dashed line). MI200's figure is an upper bound, so its "
                "share over-states the efficiency.",
                (
                    Query(
                        f"amdgpu_pcie_bandwidth_bytes_per_second{{{NODE}}}"
                        f" / amdgpu_pcie_link_max_bytes_per_second{{{NODE}}}",
                        "gpu {{gpu}} measured",
                    ),
                    Query(
                        f"amdgpu_pcie_bandwidth_upper_bound_bytes_per_second{{{NODE}}}"
                        f" / amdgpu_pcie_link_max_bytes_per_second{{{NODE}}}",
                        "gpu {{gpu}} upper bound",
                    ),
                ),
                unit="percentunit",
                width=6,
                minimum=0,
                steps=((PCIE_EFFICIENCY_TARGET_RATIO, GREEN),),
                base_color=ORANGE,
                threshold_line=True,
                may_be_empty="MI200 measures no bandwidth and MI300 has no pcie_bw estimate: one series each",
            ),
            Panel(
                "timeseries",
                "PCIe replays",
                "PCIe replays per second (NAKs sent + received): a rising rate means a marginal link.",
                Query(per_step("rate", "amdgpu_pcie_replays_total", NODE), PER_GPU),
                unit="cps",
                width=6,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "PCIe recoveries and NAKs",
                "Link recoveries (L0 -> recovery) and NAKs by direction per second.",
                (
                    Query(per_step("rate", "amdgpu_pcie_recoveries_total", NODE), "gpu {{gpu}} recovery"),
                    Query(per_step("rate", "amdgpu_pcie_naks_total", NODE), "gpu {{gpu}} NAK {{direction}}"),
                ),
                unit="cps",
                width=24,
                height=6,
                minimum=0,
                may_be_empty="only MI300 (gpu_metrics v1_5 and later) reports recoveries and NAKs",
            ),
        ),
    )


def xgmi_row() -> Row:
    return Row(
        "XGMI",
        (
            Panel(
                "timeseries",
                "XGMI bandwidth per link",
                "Data read (up) and written (down) per second over each XGMI link, from the cumulative "
                "per-link counters.",
                (
                    Query(per_step("rate", "amdgpu_xgmi_read_bytes_total", NODE), "gpu {{gpu}} link {{link}} read"),
                    Query(per_step("rate", "amdgpu_xgmi_write_bytes_total", NODE), "gpu {{gpu}} link {{link}} write"),
                ),
                unit="Bps",
                width=12,
                height=9,
                may_be_empty="only MI300 has XGMI traffic counters; MI200 has none in the upstream kernel",
                custom={"fillOpacity": 10},
                options={"negative_y": ("B",)},
            ),
            Panel(
                "stat",
                "XGMI link width and rate",
                "Lanes per XGMI link (x16) and the link rate in bytes per second (lane rate x width / 8).",
                (
                    Query(f"amdgpu_xgmi_link_width{{{NODE}}}", "gpu {{gpu}} width"),
                    Query(f"amdgpu_xgmi_link_speed_bytes_per_second{{{NODE}}}", "gpu {{gpu}} rate"),
                ),
                unit="prefix:x",
                width=6,
                height=9,
                column_units={"B": "Bps"},
                may_be_empty="MI200's gpu_metrics has no XGMI link fields",
                options={"graphMode": "none"},
            ),
            Panel(
                "status-history",
                "XGMI links up",
                "Each XGMI link's state: a link that drops makes collectives fall back to slower paths.",
                Query(f"amdgpu_xgmi_link_up{{{NODE}}}", "gpu {{gpu}} link {{link}}"),
                unit="none",
                width=6,
                height=9,
                mappings=(UP_DOWN_MAPPING,),
                steps=UP_DOWN_STEPS,
                may_be_empty="only MI300 with gpu_metrics v1_7 or later reports link state",
            ),
            Panel(
                "timeseries",
                "XGMI error events",
                "XGMI error events per step (accumulated by the exporter from the clear-on-read xgmi_error file).",
                Query(per_step("increase", "amdgpu_xgmi_error_events_total", NODE), PER_GPU),
                unit="none",
                width=8,
                custom={"drawStyle": "bars", "fillOpacity": 80},
                minimum=0,
            ),
            Panel(
                "table",
                "Topology",
                "KFD io_links from each selected GCD to its peers (another GCD's gpu index, or cpu): link "
                "type (xgmi, pcie), hops and weight.",
                f"amdgpu_topology_link_info{{{NODE}}}",
                unit="none",
                width=16,
                hide_columns=("job", "instance", "Value"),
            ),
        ),
    )


NO_HEALTH_VERDICT = "the exporter does not export the health verdict (amdgpu_health_status)"
FIT_UNFIT_MAPPING = {
    "type": "value",
    "options": {
        "0": {"text": "UNFIT", "color": RED, "index": 0},
        "1": {"text": "FIT", "color": "green", "index": 1},
    },
}


def health_row() -> Row:
    return Row(
        "Health verdict",
        (
            Panel(
                "stat",
                "Fit or unfit, per GCD",
                "The exporter's health verdict on each selected GCD (amdgpu_health_status: 1 fit, 0 unfit); the "
                "table beside it names the checks that fail.",
                Query(f"amdgpu_health_status{{{NODE}}}", PER_GPU),
                unit="none",
                width=10,
                height=7,
                mappings=(FIT_UNFIT_MAPPING,),
                steps=((0.0, RED), (1.0, "green")),
                may_be_empty=NO_HEALTH_VERDICT,
            ),
            Panel(
                "table",
                "Failing health checks",
                "Each check that fails on a selected GCD now, with its severity (amdgpu_health_check, 1 per "
                "failing check).",
                f"amdgpu_health_check{{{NODE}}} == 1",
                unit="none",
                width=14,
                height=7,
                hide_columns=("instance", "job", "Value"),
                may_be_empty=f"every check passes, or {NO_HEALTH_VERDICT}",
            ),
        ),
    )


def ras_row() -> Row:
    return Row(
        "ECC / RAS",
        (
            Panel(
                "table",
                "ECC errors by block",
                "RAS error counts since driver load by block and type, summed over the selected GCDs, largest first.",
                f"sort_desc(sum by (block, type) (amdgpu_ecc_errors_total{{{NODE}}}))",
                unit="none",
                width=10,
                height=9,
                options={"renameByName": {"Value": "Errors"}},
            ),
            Panel(
                "timeseries",
                "ECC errors per interval",
                "New ECC errors per step by GCD, block and type.",
                Query(
                    f"sum by (gpu, block, type) ({per_step('increase', 'amdgpu_ecc_errors_total', NODE)})",
                    "gpu {{gpu}} {{block}} {{type}}",
                ),
                unit="none",
                width=10,
                height=9,
                custom={"drawStyle": "bars", "fillOpacity": 80},
                minimum=0,
            ),
            Panel(
                "stat",
                "Retired VRAM pages",
                "VRAM pages RAS has retired; a growing number means failing HBM.",
                Query(f"amdgpu_ras_retired_pages{{{NODE}}}", PER_GPU),
                unit="none",
                width=4,
                height=9,
                steps=((1.0, ORANGE), (RETIRED_PAGES_CRITICAL, RED)),
            ),
        ),
    )


def firmware_row() -> Row:
    return Row(
        "Firmware and suggestions",
        (
            Panel(
                "table",
                "Firmware and VBIOS",
                "Firmware version of every block, and the VBIOS, per selected GCD.",
                (
                    f"max by (gpu, block, version) (amdgpu_firmware_info{{{NODE}}}) or "
                    f"max by (gpu, block, version) (label_replace(label_replace(amdgpu_device_info{{{NODE}}}, "
                    f'"block", "vbios", "", ""), "version", "$1", "vbios", "(.*)"))'
                ),
                unit="none",
                width=10,
                height=10,
                hide_columns=("Value",),
            ),
            Panel(
                "stat",
                "Suggested gfx clock reduction",
                "How far the exporter suggests lowering the gfx clock ceiling (0 = no suggestion). It only "
                "suggests; nothing is written to the GPU.",
                Query(f"amdgpu_clock_down_suggested_ratio{{{NODE}}}", PER_GPU),
                unit="percentunit",
                width=4,
                height=10,
                steps=((0.01, ORANGE),),
            ),
            against_reference(
                "GFX clock vs suggested ceiling",
                "The gfx clock (solid) and, while a suggestion is active, the suggested ceiling (dashed).",
                Query(f'amdgpu_clock_hertz{{{NODE}, domain="gfx"}}', "gpu {{gpu}} gfx"),
                Query(f"amdgpu_suggested_gfx_clock_max_hertz{{{NODE}}}", "gpu {{gpu}} suggested max"),
                unit="hertz",
                width=10,
                height=10,
                minimum=None,
                may_be_empty="the suggested ceiling exists only while a suggestion is active",
            ),
            Panel(
                "table",
                "Active alerts and suggestion",
                "In-daemon alerts firing on the selected GCDs with the suggested gfx clock ceiling.",
                (
                    f"amdgpu_alert_firing{{{NODE}}} == 1",
                    f"amdgpu_suggested_gfx_clock_max_hertz{{{NODE}}}",
                ),
                unit="none",
                width=24,
                height=5,
                column_units={"Value #B": "hertz"},
                hide_columns=("job", "instance", "Value #A"),
                options={"renameByName": {"Value #B": "Suggested gfx max"}},
                may_be_empty="nothing is firing",
            ),
        ),
    )


OFF_OR_FREE = "the exporter runs without {option}, or nothing holds the selected GCDs now"


def attribution_row() -> Row:
    """Who is on each GCD: pods (--kubernetes), Slurm jobs (--slurm.state-dir), processes (--collector.processes)."""
    return Row(
        "Who is on each GCD",
        (
            Panel(
                "table",
                "Pods",
                "The Kubernetes containers holding each GCD now (device plugin or DRA), from the kubelet. "
                "Every per-GCD series also carries pod, namespace and container.",
                f"amdgpu_allocation_info{{{NODE}}}",
                unit="none",
                width=8,
                may_be_empty=OFF_OR_FREE.format(option="--kubernetes"),
                hide_columns=("job", "instance", "Value"),
            ),
            Panel(
                "table",
                "Slurm jobs",
                "The Slurm jobs holding each GCD now, from the prolog's state files. Every per-GCD series "
                "also carries job_id, job_user and job_partition.",
                f"amdgpu_job_info{{{NODE}}}",
                unit="none",
                width=8,
                may_be_empty=OFF_OR_FREE.format(option="--slurm.state-dir"),
                hide_columns=("job", "instance", "Value"),
            ),
            Panel(
                "stat",
                "Attribution sources",
                "Whether each attribution source's last read worked (kubernetes: the kubelet answered "
                "within its deadline). Down: the labels keep the last good answer for a minute, then empty.",
                Query(f"amdgpu_exporter_attribution_up{{{NODE_ALL_GPUS}}}", "{{source}}"),
                unit="none",
                width=8,
                mappings=(UP_DOWN_MAPPING,),
                steps=UP_DOWN_STEPS,
                may_be_empty="no attribution option is on",
            ),
            Panel(
                "timeseries",
                "Process VRAM",
                "VRAM each process has allocated, per GCD (the top processes by VRAM, from the KFD).",
                Query(f"amdgpu_process_memory_bytes{{{NODE}}}", "gpu {{gpu}} {{comm}} ({{pid}})"),
                unit="bytes",
                width=8,
                minimum=0,
                may_be_empty=OFF_OR_FREE.format(option="--collector.processes"),
            ),
            Panel(
                "timeseries",
                "Process CU occupancy",
                "Share of each GCD's compute units the process's waves occupy.",
                Query(f"amdgpu_process_compute_unit_occupancy_ratio{{{NODE}}}", "gpu {{gpu}} {{comm}} ({{pid}})"),
                unit="percentunit",
                width=8,
                minimum=0,
                maximum=1,
                may_be_empty=OFF_OR_FREE.format(option="--collector.processes"),
            ),
            Panel(
                "timeseries",
                "Process SDMA busy",
                "Share of time each process's SDMA (copy engine) queues were busy, per GCD.",
                Query(f"rate(amdgpu_process_sdma_seconds_total{{{NODE}}}[$__rate_interval])", "gpu {{gpu}} {{comm}}"),
                unit="percentunit",
                width=8,
                minimum=0,
                may_be_empty=OFF_OR_FREE.format(option="--collector.processes"),
            ),
        ),
    )


def exporter_row() -> Row:
    return Row(
        "Exporter",
        (
            Panel(
                "timeseries",
                "Poll cycle duration",
                "Wall time of one poll cycle of all devices (p50, p99). Scrapes are answered from the last "
                "finished cycle's snapshot, so a slow cycle never delays a scrape.",
                (Query(poll_duration_quantile(0.5), "p50"), Query(poll_duration_quantile(0.99), "p99")),
                unit="s",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Sample age",
                "Age at scrape time of each GCD's latest good sample, and of the poll loop's last cycle.",
                (
                    Query(age_at_scrape("amdgpu_sample_timestamp_seconds", NODE), PER_GPU),
                    Query(age_at_scrape("amdgpu_exporter_last_poll_timestamp_seconds", NODE_ALL_GPUS), "poll loop"),
                ),
                unit="s",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Read timeouts",
                "Device reads that missed their deadline per step (a hung GPU shows up here first).",
                Query(per_step("increase", "amdgpu_exporter_read_timeouts_total", NODE), PER_GPU),
                unit="none",
                width=8,
                minimum=0,
            ),
            Panel(
                "timeseries",
                "Read errors, worker restarts, Alertmanager pushes",
                "Failed reads by reason, restarts of the rocm-smi worker process, and alert pushes to "
                "Alertmanager by result, per step.",
                (
                    Query(per_step("increase", "amdgpu_exporter_read_errors_total", NODE), "gpu {{gpu}} {{reason}}"),
                    Query(
                        per_step("increase", "amdgpu_exporter_worker_restarts_total", NODE_ALL_GPUS), "worker restarts"
                    ),
                    Query(
                        per_step("increase", "amdgpu_exporter_alertmanager_notifications_total", NODE_ALL_GPUS),
                        "Alertmanager {{result}}",
                    ),
                ),
                unit="none",
                width=16,
                minimum=0,
                may_be_empty="no read has failed, the sysfs source has no worker, and no Alertmanager is configured",
            ),
            Panel(
                "timeseries",
                "Fast samples per second",
                "gpu_metrics reads per second per GCD by the fast sampler (10 at --fast.interval=100ms), and its "
                "failed reads by reason.",
                (
                    Query(per_step("rate", "amdgpu_exporter_fast_samples_total", NODE), PER_GPU),
                    Query(per_step("rate", "amdgpu_exporter_fast_read_errors_total", NODE), "gpu {{gpu}} {{reason}}"),
                ),
                unit="reqps",
                width=8,
                minimum=0,
                may_be_empty="no fast read has failed",
            ),
            Panel(
                "timeseries",
                "Fast cycle duration",
                "Wall time of one fast-sampler cycle: one gpu_metrics read of every GCD (p50, p99).",
                (Query(fast_cycle_quantile(0.5), "p50"), Query(fast_cycle_quantile(0.99), "p99")),
                unit="s",
                width=8,
                minimum=0,
            ),
            Panel(
                "table",
                "Exporter build",
                "Exporter version and the source it reads (sysfs or rocm-smi), with why that source was chosen.",
                f"amdgpu_exporter_build_info{{{NODE_ALL_GPUS}}}",
                unit="none",
                width=8,
                hide_columns=("job", "Value"),
            ),
            Panel(
                "stat",
                "Sliding window",
                "The length of the window every *_window_* series covers (--window): min, max and mean over "
                "the fast samples of the last this many seconds, whoever scrapes.",
                f"amdgpu_exporter_window_seconds{{{NODE_ALL_GPUS}}}",
                unit="s",
                width=8,
            ),
        ),
    )


def host_and_http_row() -> Row:
    """What the host runs (the doctor's version matrix as series) and the HTTP layer's own state."""
    only_with_web_config = "the HTTP layer reports only when --web.config.file is given"
    return Row(
        "Host versions and HTTP",
        (
            Panel(
                "table",
                "amdgpu driver",
                "The host's amdgpu driver version and initstate, the kernel release and ppfeaturemask "
                "(what `amdgpu-exporter doctor` prints first).",
                f"amdgpu_driver_info{{{NODE_ALL_GPUS}}}",
                width=8,
                hide_columns=("job", "Value"),
            ),
            Panel(
                "table",
                "ROCm and SMI libraries",
                "ROCm installs and SMI libraries (librocm_smi64, libamd_smi) found on the host, with the "
                "versions they report: the rocm-smi source needs a library of a version it knows.",
                (
                    Query(f"amdgpu_rocm_info{{{NODE_ALL_GPUS}}}", "rocm"),
                    Query(f"amdgpu_smi_library_info{{{NODE_ALL_GPUS}}}", "library"),
                ),
                width=16,
                hide_columns=("job", "Value"),
                may_be_empty="no ROCm install and no SMI library on the host (the sysfs source needs neither)",
            ),
            Panel(
                "timeseries",
                "HTTP connections",
                "Open HTTP connections (TLS handshakes included) against the cap the open-files budget sets; "
                "at the cap, new connections wait.",
                (
                    Query(f"amdgpu_exporter_http_connections{{{NODE_ALL_GPUS}}}", "open"),
                    Query(f"amdgpu_exporter_http_max_connections{{{NODE_ALL_GPUS}}}", "cap"),
                ),
                unit="none",
                width=8,
                minimum=0,
                dashed=("B",),
                may_be_empty=only_with_web_config,
            ),
            Panel(
                "timeseries",
                "HTTP rejections",
                "Connections and requests the HTTP layer refused per step, by reason (failed basic auth, "
                "rate limit, TLS handshake, oversized headers, slow clients).",
                Query(per_step("increase", "amdgpu_exporter_http_rejections_total", NODE_ALL_GPUS), "{{reason}}"),
                unit="none",
                width=8,
                minimum=0,
                may_be_empty=only_with_web_config + ", and nothing was refused",
            ),
            Panel(
                "stat",
                "Web config in effect",
                "1: the web configuration on disk is the one in effect. 0: the last edit was invalid and the "
                "last good one is kept (see the reloads by result beside it).",
                (
                    Query(f"amdgpu_exporter_web_config_last_reload_successful{{{NODE_ALL_GPUS}}}", "in effect"),
                    Query(
                        per_step("increase", "amdgpu_exporter_reloads_total", f'what="web_config",{NODE_ALL_GPUS}'),
                        "reloads {{result}}",
                    ),
                ),
                unit="none",
                width=8,
                may_be_empty=only_with_web_config,
            ),
        ),
    )


def exporter_health_row(limits: MemoryLimits) -> Row:
    resident = exporter_process("process_resident_memory_bytes", NODE_ALL_GPUS)
    systemd, kubernetes = limits.systemd_memory_max_bytes, limits.kubernetes_memory_limit_bytes
    return Row(
        "Exporter health",
        (
            Panel(
                "timeseries",
                "Exporter memory against its limits",
                "Resident and virtual memory of the exporter process, against the memory ceilings the project "
                f"ships: the systemd unit's MemoryMax ({mebibytes(systemd)}, dashed) and the DaemonSet's memory "
                f"limit ({mebibytes(kubernetes)}, dotted). Only resident memory counts against either.",
                (
                    Query(resident, "resident"),
                    Query(exporter_process("process_virtual_memory_bytes", NODE_ALL_GPUS), "virtual"),
                    Query(f"vector({promql_number(systemd)})", "systemd MemoryMax"),
                    Query(f"vector({promql_number(kubernetes)})", "DaemonSet memory limit"),
                ),
                unit="bytes",
                width=10,
                minimum=0,
                dashed=("C",),
                dotted=("D",),
            ),
            Panel(
                "stat",
                "Memory share of the tighter limit",
                f"Resident memory as a share of the smaller shipped ceiling ({mebibytes(limits.tightest_bytes)}); "
                f"orange from {MEMORY_WARNING_RATIO:.0%}, red at the limit (the kernel kills the exporter there).",
                Query(f"{resident} / {promql_number(limits.tightest_bytes)}", "resident"),
                unit="percentunit",
                width=4,
                steps=((MEMORY_WARNING_RATIO, ORANGE), (1.0, RED)),
            ),
            Panel(
                "timeseries",
                "Exporter CPU",
                "CPU time the exporter process uses per second of wall time (1 = one core).",
                Query(
                    only_exporter(per_step("rate", "process_cpu_seconds_total", NODE_ALL_GPUS), NODE_ALL_GPUS), "cpu"
                ),
                unit="percentunit",
                width=5,
                minimum=0,
            ),
            against_reference(
                "Open file descriptors",
                "Descriptors the exporter holds (sysfs files, sockets, HTTP connections) against its limit "
                "(dashed; the unit raises it with LimitNOFILE).",
                Query(exporter_process("process_open_fds", NODE_ALL_GPUS), "open"),
                Query(exporter_process("process_max_fds", NODE_ALL_GPUS), "limit"),
                unit="none",
                width=5,
            ),
            Panel(
                "timeseries",
                "File errors",
                "Failed sysfs file reads per step by GCD, file and reason (a file the driver stopped providing, "
                "a permission change, a malformed value).",
                Query(
                    per_step("increase", "amdgpu_exporter_file_errors_total", NODE), "gpu {{gpu}} {{file}} {{reason}}"
                ),
                unit="none",
                width=10,
                minimum=0,
                may_be_empty="no sysfs file read has failed since the exporter started",
            ),
            Panel(
                "timeseries",
                "Stage failures, discoveries and reloads",
                "Failures per step of the stages after a poll (rules, render, Alertmanager; /readyz reports them), "
                "device discoveries by result (a GPU that appears or disappears triggers one), and re-reads of the "
                "config, rule and web config files by result (a failure kept what runs; the log says why).",
                (
                    Query(
                        per_step("increase", "amdgpu_exporter_stage_failures_total", NODE_ALL_GPUS), "{{stage}} failed"
                    ),
                    Query(
                        per_step("increase", "amdgpu_exporter_discoveries_total", NODE_ALL_GPUS), "discovery {{result}}"
                    ),
                    Query(
                        per_step("increase", "amdgpu_exporter_reloads_total", NODE_ALL_GPUS),
                        "reload {{what}} {{result}}",
                    ),
                ),
                unit="none",
                width=8,
                minimum=0,
            ),
            Panel(
                "stat",
                "Devices present",
                "GCDs the last discovery found, and how many of them the last cycle read in time: fewer present "
                "than the node has is a lost GPU (the rules' device count).",
                (
                    Query(f"sum(amdgpu_device_present{{{NODE_ALL_GPUS}}})", "present"),
                    Query(f"sum(amdgpu_up{{{NODE_ALL_GPUS}}})", "up"),
                ),
                unit="none",
                width=3,
            ),
            Panel(
                "stat",
                "Exporter uptime",
                "Time since the exporter process started (a restart resets it).",
                Query(f"time() - {exporter_process('process_start_time_seconds', NODE_ALL_GPUS)}", "uptime"),
                unit="s",
                width=3,
            ),
        ),
    )


def node_dashboard(t: Thresholds, limits: MemoryLimits) -> Dashboard:
    return Dashboard(
        uid=NODE_UID,
        title="AMD GPU / Node and GCD detail",
        description="One node's AMD Instinct GCDs in detail: who holds them, thermals, power, utilisation "
        "waveform, memory, clocks, PCIe, XGMI, RAS, firmware and the exporter itself.",
        variables=(
            datasource_variable(),
            query_variable("instance", "Node", "label_values(amdgpu_up, instance)"),
            query_variable("gpu", "GCD", 'label_values(amdgpu_up{instance="$instance"}, gpu)', multi=True),
        ),
        rows=(
            overview_row(t),
            health_row(),
            attribution_row(),
            thermals_row(t),
            power_row(),
            busy_row(),
            memory_row(),
            clocks_row(),
            pcie_row(),
            xgmi_row(),
            ras_row(),
            firmware_row(),
            exporter_row(),
            exporter_health_row(limits),
            host_and_http_row(),
        ),
        time_from="now-1h",
        annotations=(
            {
                "datasource": DATASOURCE,
                "enable": True,
                "expr": f"amdgpu_alert_firing{{{NODE}}} == 1",
                "hide": False,
                "iconColor": "red",
                "name": "In-daemon alerts",
                "step": "10s",
                "tagKeys": "alert,severity",
                "titleFormat": "{{alert}} on gpu {{gpu}}",
                "useValueForTime": False,
            },
            # When the in-daemon rules advised a lower gfx clock ceiling (a region while advised; the
            # ceiling itself is on the clocks row's suggested-ceiling series).
            {
                "datasource": DATASOURCE,
                "enable": True,
                "expr": f"amdgpu_suggested_gfx_clock_max_hertz{{{NODE}}} > 0",
                "hide": False,
                "iconColor": "orange",
                "name": "Clock-down suggestions",
                "step": "10s",
                "tagKeys": "gpu",
                "titleFormat": "gfx clock ceiling suggested for gpu {{gpu}}",
                "useValueForTime": False,
            },
        ),
    )
