"""The text and binary content of every file that changes with the workload, per GCD.

Formats follow the driver's sysfs_emit calls (amdgpu_pm.c, aldebaran_ppt.c, smu_v13_0_6_ppt.c,
amdgpu_ras.c): "%d: %uMhz %s\n" DPM lines with a trailing space on unselected levels, hwmon in
milli-units, "ue: N\nce: N\n" RAS counts (a third "de:" line only on the UMC block of a GCD given an
ecc_de fault, as newer kernels print it: Debian's librocm_smi aborts on one), PCIe AER counters as
drivers/pci/pcie/aer.c prints them ("<name> <count>" per error bit, then TOTAL_ERR_<severity>).
Debugfs files (kernel/debug/dri/<minor>/...) sit under the same root, as /sys/kernel/debug does.
"""

from __future__ import annotations

from exporter.simulator import cper_writer, gpu_metrics_writer
from exporter.simulator.fleet import GcdLayout
from exporter.simulator.physics import DieReading, bad_page_threshold

_EPSILON_MHZ = 1  # the driver's "same level" tolerance


def pp_dpm_fine_grained(low: int, high: int, now: int, deep_sleep: int | None = None) -> str:
    """pp_dpm_sclk of a fine-grained gfxclk: min and max, plus `now` as a middle line when between."""
    if deep_sleep is not None:
        return f"S: {deep_sleep}Mhz *\n0: {low}Mhz \n1: {high}Mhz \n"
    if low + _EPSILON_MHZ < now < high - _EPSILON_MHZ:
        return f"0: {low}Mhz \n1: {now}Mhz *\n2: {high}Mhz \n"
    return pp_dpm_levels((low, high), now)


def pp_dpm_levels(levels: tuple[int, ...], now: int) -> str:
    return "".join(
        f"{i}: {level}Mhz {'*' if abs(level - now) <= _EPSILON_MHZ else ''}\n" for i, level in enumerate(levels)
    )


def pp_dpm_pcie(gts: float, width: int) -> str:
    return f"0: 2.5GT/s, x{width} 619Mhz \n1: {gts:.1f}GT/s, x{width} 619Mhz *\n"


def ras_count(uncorrectable: int, correctable: int, deferred: int | None = None) -> str:
    text = f"ue: {uncorrectable}\nce: {correctable}\n"
    return text if deferred is None else f"{text}de: {deferred}\n"


def bad_pages(pages: tuple[int, ...], pending: tuple[int, ...] = ()) -> str:
    """ras/gpu_vram_bad_pages: page frame, size, status (R retired, P pending retirement), by page."""
    status = {**dict.fromkeys(pending, "P"), **dict.fromkeys(pages, "R")}
    return "".join(f"0x{page:08x} : 0x{4096:08x} : {status[page]}\n" for page in sorted(status))


# The error bits drivers/pci/pcie/aer.c lists in each file, in its order; the simulated errors go to one.
AER_NAMES = {
    "correctable": (
        "RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF",
    ),
    "nonfatal": (
        "Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
        "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
        "PoisonTLPBlocked",
    ),
}  # fmt: skip
AER_FILES = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal", "fatal": "aer_dev_fatal"}
AER_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
_AER_BIT = {"correctable": "BadTLP", "nonfatal": "CmpltTO", "fatal": "SDES"}


def aer_counts(severity: str, total: int) -> str:
    """One aer_dev_* file with `total` errors, all on the bit a simulated fault of that severity sets."""
    names = AER_NAMES["correctable" if severity == "correctable" else "nonfatal"]
    bit = _AER_BIT[severity]
    lines = "".join(f"{name} {total if name == bit else 0}\n" for name in names)
    return f"{lines}{AER_TOTALS[severity]} {total}\n"


def aer_files(folder: str, port: str, r: DieReading) -> dict[str, str]:
    return {f"{folder}/{file}": aer_counts(sev, r.aer.get((port, sev), 0)) for sev, file in AER_FILES.items()}


def debugfs_dir(gcd: GcdLayout) -> str:
    """The device's debugfs folder (dri/<primary minor>), below the root as /sys/kernel/debug is below /sys."""
    return f"kernel/debug/dri/{gcd.partitions[0].card_minor}"


def cper_ring(gcd: GcdLayout, r: DieReading, started_wall: float) -> bytes:
    """amdgpu_ring_cper: the records of the GCD's cper_* faults (socket = its XGMI physical id)."""
    socket = gcd.xgmi_physical_id or 0
    records = [
        cper_writer.record(
            cper_unix_seconds(started_wall, at), severity, f"{socket}:{n:X}", gcd.model.device_id, socket
        )
        for n, (at, severity) in enumerate(r.cper_records, start=1)
    ]
    return cper_writer.ring(records)


def cper_unix_seconds(started_wall: float, elapsed: float) -> int:
    """The whole second a record logged `elapsed` s after the tree was written carries (UTC)."""
    return int(started_wall + elapsed)


def hwmon_dir(gcd: GcdLayout) -> str:
    return f"{gcd.device_relpath}/hwmon/hwmon{gcd.hwmon_index}"


_HWMON_TEMP_INDEX = {"edge": 1, "junction": 2, "memory": 3}
_DPM_CLOCKS = ("mclk", "fclk", "socclk", "vclk", "dclk")  # discrete levels: AsicModel `<clock>_levels`


def dynamic_files(gcd: GcdLayout, r: DieReading, started_wall: float = 0.0) -> dict[str, bytes]:
    """Path (relative to the sysfs root) -> content for every workload-dependent file of a GCD
    (`started_wall`: unix time of the tree's t=0, for the times the driver writes into records)."""
    m = gcd.model
    dev = gcd.device_relpath
    hw = hwmon_dir(gcd)
    sclk_text = pp_dpm_fine_grained(m.sclk_range[0], m.sclk_range[1], r.sclk, r.sclk if r.sclk_deep_sleep else None)
    files: dict[str, str | bytes] = {
        f"{dev}/gpu_busy_percent": f"{r.gfx_busy}\n",
        f"{dev}/mem_busy_percent": f"{r.mem_busy}\n",
        f"{dev}/mem_info_vram_used": f"{r.vram_used}\n",
        f"{dev}/mem_info_vis_vram_used": f"{r.vram_used}\n",
        f"{dev}/mem_info_gtt_used": f"{r.gtt_used}\n",
        f"{dev}/pp_dpm_sclk": sclk_text,
        **{f"{dev}/pp_dpm_{c}": pp_dpm_levels(getattr(m, f"{c}_levels"), getattr(r, c)) for c in _DPM_CLOCKS},
        f"{dev}/pcie_replay_count": f"{r.pcie_replays}\n",
        f"{dev}/ras/gpu_vram_bad_pages": bad_pages(r.retired_pages, r.pending_pages),
        f"{dev}/current_link_speed": f"{r.pcie_gts:.1f} GT/s PCIe\n",
        f"{dev}/current_link_width": f"{r.pcie_width}\n",
        **aer_files(dev, "device", r),
        **aer_files(dev.rpartition("/")[0], "upstream", r),
        f"{debugfs_dir(gcd)}/ras/bad_page_cnt_threshold": f"{bad_page_threshold(m)}\n",
        f"{dev}/gpu_metrics": gpu_metrics_blob(gcd, r),
        f"{hw}/freq1_input": f"{r.sclk * 1_000_000}\n",
        f"{hw}/freq2_input": f"{r.mclk * 1_000_000}\n",
    }
    if r.pcie_bw is not None:
        files[f"{dev}/pcie_bw"] = "{} {} {}\n".format(*r.pcie_bw)
    if m.pp_dpm_pcie:
        files[f"{dev}/pp_dpm_pcie"] = pp_dpm_pcie(r.pcie_gts, r.pcie_width)
    if m.compute_partitions:  # the CPER ring (kernel 6.15+): MI300-class, whose RAS goes through ACA
        files[f"{debugfs_dir(gcd)}/amdgpu_ring_cper"] = cper_ring(gcd, r, started_wall)
    for block, (ue, ce) in r.ecc.items():
        files[f"{dev}/ras/{block}_err_count"] = ras_count(ue, ce, r.ecc_deferred.get(block))
    for sensor, index in _HWMON_TEMP_INDEX.items():
        if sensor in r.temps:
            files[f"{hw}/temp{index}_input"] = f"{r.temps[sensor] * 1000}\n"
    power_uw = (r.power_w or 0) * 1_000_000
    files[f"{hw}/{m.hwmon_power_file}"] = f"{power_uw}\n"
    if r.vddgfx_mv is not None:
        files[f"{hw}/in0_input"] = f"{r.vddgfx_mv}\n"
    if gcd.xcp_metrics_version is not None:
        for part in gcd.partitions:
            home = dev if part.index == 0 else part.platform_relpath
            values = partition_metrics_values(gcd, r, part.index)
            files[f"{home}/xcp/xcp_metrics"] = gpu_metrics_writer.encode_partition_metrics(
                gcd.xcp_metrics_version, values
            )
    return {path: (c.encode() if isinstance(c, str) else c) for path, c in files.items()}


def gpu_metrics_blob(gcd: GcdLayout, r: DieReading) -> bytes:
    return gpu_metrics_writer.encode(gcd.metrics_version, gpu_metrics_values(gcd, r))


def gpu_metrics_values(gcd: GcdLayout, r: DieReading) -> dict[str, gpu_metrics_writer.Value]:
    """Every field the driver sets in this GCD's table, in the table's own units (the rest stays
    all-ones). Fixed layouts take `xcp_stats` as a list of per-partition dicts; v1.9 is flat."""
    # the fields every version has; power and energy read 0 on an MI250X secondary die
    values: dict[str, gpu_metrics_writer.Value] = {
        "temperature_hotspot": r.temps["junction"],
        "temperature_mem": r.temps["memory"],
        "temperature_vrsoc": r.temps["vr_soc"],
        "average_gfx_activity": r.gfx_busy,
        "average_umc_activity": r.mem_busy,
        "energy_accumulator": r.energy_ticks or 0,
        "system_clock_counter": r.system_clock_ns,
        "pcie_link_width": r.pcie_width,
        "pcie_link_speed": round(r.pcie_gts * 10),
        "gfx_activity_acc": r.gfx_activity_acc,
        "mem_activity_acc": r.mem_activity_acc,
        "firmware_timestamp": r.firmware_timestamp,
        "current_uclk": r.mclk,
    }
    values.update(_v1_3(r) if gcd.metrics_version == (1, 3) else _mi300(gcd, r))
    return values


def _v1_3(r: DieReading) -> dict[str, gpu_metrics_writer.Value]:
    t = r.temps
    # Aldebaran leaves average_mm_activity, vclk1/dclk1 and the voltages at the 0xFF fill
    return {
        "temperature_edge": t["edge"],
        "temperature_vrgfx": t["vr_gfx"],
        "temperature_vrmem": t["vr_mem"],
        "average_socket_power": r.power_w or 0,
        "average_gfxclk_frequency": r.sclk,
        "average_socclk_frequency": r.socclk,
        "average_uclk_frequency": r.mclk,
        "average_vclk0_frequency": 0,
        "average_dclk0_frequency": 0,
        "current_gfxclk": r.sclk,
        "current_socclk": r.socclk,
        "current_vclk0": r.vclk,
        "current_dclk0": r.dclk,
        "throttle_status": r.throttle_status,
        "current_fan_speed": 0,
        "temperature_hbm": [t[f"hbm{k}"] for k in range(4)],
        "indep_throttle_status": r.indep_throttle_status,
    }


NUM_VCN = 4  # video decoders of an MI300-class socket (one per AID)


def partition_vcns(gcd: GcdLayout, partition: int) -> list[int]:
    """The VCN instances a partition owns. In CPX two partitions of one AID share its decoder."""
    count = len(gcd.partitions)
    if count <= NUM_VCN:
        each = NUM_VCN // count
        return list(range(partition * each, (partition + 1) * each))
    return [partition * NUM_VCN // count]


def _xcp_block(gcd: GcdLayout, r: DieReading, p: int, version: tuple[int, int]) -> dict[str, list[int]]:
    """One partition's arrays as `version`'s xcp_stats[] entry holds them (v1.9 and xcp_metrics: as
    v1_8's): the driver fills index 0..n-1 of each array with this partition's own XCC / VCN
    instances and leaves the rest all-ones."""
    xccs = gcd.partitions[p].xcc_count
    vcns = len(partition_vcns(gcd, p))
    ppt, thm, low = r.below_host_limit_ppt_ticks, r.below_host_limit_thm_ticks, r.partition_low_utilization_ticks[p]
    block = {
        "gfx_busy_inst": [r.partition_gfx_busy[p]] * xccs,
        "jpeg_busy": [0] * (vcns * gcd.model.jpeg_rings_per_vcn),
        "vcn_busy": [0] * vcns,
        "gfx_busy_acc": [r.partition_gfx_acc[p]] * xccs,
    }
    if version == (1, 7):
        block["gfx_below_host_limit_acc"] = [ppt + thm] * xccs
    elif version >= (1, 8):
        block["gfx_below_host_limit_ppt_acc"] = [ppt] * xccs
        block["gfx_below_host_limit_thm_acc"] = [thm] * xccs
        block["gfx_low_utilization_acc"] = [low] * xccs
        block["gfx_below_host_limit_total_acc"] = [ppt + thm + low] * xccs
    return block


def _mi300(gcd: GcdLayout, r: DieReading) -> dict[str, gpu_metrics_writer.Value]:
    m = gcd.model
    version = gcd.metrics_version
    assert r.xgmi_read_kb is not None and r.xgmi_write_kb is not None and r.xgmi_links_up is not None
    values: dict[str, gpu_metrics_writer.Value] = {
        "curr_socket_power": r.power_w or 0,
        "gfxclk_lock_status": 0,
        "xgmi_link_width": m.xgmi_link_width,
        "xgmi_link_speed": m.xgmi_link_speed_gbps,
        "pcie_bandwidth_acc": r.pcie_bw_acc_gbs or 0,
        "pcie_bandwidth_inst": r.pcie_bw_inst_gbs or 0,
        "pcie_l0_to_recov_count_acc": r.pcie_recoveries or 0,
        "pcie_replay_count_acc": r.pcie_replays,
        "pcie_replay_rover_count_acc": 0,
        "xgmi_read_data_acc": list(r.xgmi_read_kb),
        "xgmi_write_data_acc": list(r.xgmi_write_kb),
        "current_gfxclk": [r.sclk] * 8,
        "current_socclk": [r.socclk] * 4,
        "current_vclk0": [r.vclk] * 4,
        "current_dclk0": [r.dclk] * 4,
    }
    if version in ((1, 4), (1, 5)):
        # smu_v13_0_6 stopped reporting throttle reasons through the table: it writes 0
        values["throttle_status"] = 0
        values["vcn_activity"] = [0] * 4
    if version == (1, 5):
        values["jpeg_activity"] = [0] * 32
    if version >= (1, 5):
        values["pcie_nak_sent_count_acc"] = r.pcie_naks_sent or 0
        values["pcie_nak_rcvd_count_acc"] = r.pcie_naks_received or 0
    if version >= (1, 6):
        ticks = round(r.t * 1000)  # the firmware accumulates once per ms
        values.update(
            {
                "accumulation_counter": ticks & 0xFFFFFFFF,
                **{f"{name}_residency_acc": ticks for name, ticks in r.residency_ticks.items()},
                "pcie_lc_perf_other_end_recovery": 0,
            }
        )
        if version >= (1, 7):
            values["mem_max_bandwidth"] = m.mem_max_bandwidth_gbs
            values["xgmi_link_status"] = [1 if up else 0 for up in r.xgmi_links_up]
        blocks = [_xcp_block(gcd, r, p, version) for p in range(len(gcd.partitions))]
        if version == (1, 9):
            # one device-wide set of per-XCC arrays, the partitions' XCCs in order; no num_partition
            values.update({name: [v for block in blocks for v in block[name]] for name in blocks[0]})
            values["jpeg_busy"] = [0] * (NUM_VCN * gcd.model.jpeg_rings_per_vcn)
            values["vcn_busy"] = [0] * NUM_VCN
        else:
            values["num_partition"] = len(blocks)
            values["xcp_stats"] = blocks
    return values


def partition_metrics_values(gcd: GcdLayout, r: DieReading, p: int) -> dict[str, gpu_metrics_writer.Value]:
    """One partition's xcp_metrics: its own XCCs' clocks and busy, its decoders, its host-limit counters."""
    xccs = gcd.partitions[p].xcc_count
    vcns = len(partition_vcns(gcd, p))
    return {
        "current_gfxclk": [r.sclk] * xccs,
        "current_socclk": [r.socclk] * vcns,
        "current_vclk0": [r.vclk] * vcns,
        "current_dclk0": [r.dclk] * vcns,
        "current_uclk": r.mclk,
        **_xcp_block(gcd, r, p, (1, 8)),
    }
