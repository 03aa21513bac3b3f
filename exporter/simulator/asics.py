"""Static characteristics of the simulated ASICs: what a board is, not what it is doing.

Numbers come from the amdgpu driver (aldebaran_ppt.c, smu_v13_0_6_ppt.c), public board specs and
what real boards report; where a board's exact value is unknown a plausible one is used. Power in W,
clocks in MHz, temperatures in °C, sizes in bytes — the units the driver itself writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ThermalLimits:
    """hwmon limits for one sensor: tempN_crit and tempN_emergency (°C)."""

    critical: int
    emergency: int


# The gpu_metrics table each kernel release writes, per power-management driver file
# (drivers/gpu/drm/amd/pm/swsmu/smu13/): (first release, table), read from the drm sources of the
# releases 6.1, 6.6 .. 7.0. The last entry is what a current kernel writes, and so what the
# simulator writes by default. MI210/MI250X's Aldebaran has written v1_3 since before 6.1.
KERNEL_TABLES: dict[str, tuple[tuple[str, tuple[int, int]], ...]] = {
    "aldebaran_ppt.c": (("6.1", (1, 3)),),
    "smu_v13_0_6_ppt.c": (("6.6", (1, 3)), ("6.7", (1, 5)), ("6.13", (1, 7)), ("6.16", (1, 8)), ("6.19", (1, 9))),
    "smu_v13_0_12_ppt.c": (("6.15", (1, 7)), ("6.16", (1, 8)), ("6.19", (1, 9))),
}


@dataclass(frozen=True, slots=True)
class AsicModel:
    name: str  # fleet-spec name: "MI250X"
    product_name: str  # FRU product_name as the driver shows it
    product_number: str
    asic: str  # DeviceIdentity.asic
    device_id: int
    subsystem_device: int
    revision: int
    pci_class: int
    gcds_per_package: int
    board_type: str  # board_info "type : <x>"
    vbios: str
    smu_driver: str  # the kernel's power-management file for it: a key of KERNEL_TABLES
    metrics_versions: tuple[tuple[int, int], ...]  # the gpu_metrics versions the simulator can write for it
    # memory
    vram_bytes: int
    vram_vendor: str
    gtt_bytes: int
    # clocks: sclk is fine-grained (min, max); the others are discrete DPM levels
    sclk_range: tuple[int, int]
    mclk_levels: tuple[int, ...]
    fclk_levels: tuple[int, ...]
    socclk_levels: tuple[int, ...]
    vclk_levels: tuple[int, ...]
    dclk_levels: tuple[int, ...]
    sclk_deep_sleep: int | None  # MI300X shows an "S:" line when gfx sleeps
    # PCIe / XGMI
    pcie_gts: float  # 16.0 = Gen4
    pcie_width: int
    pcie_bw_file: bool  # pcie_bw exists (MI200) or not (MI300X on newer kernels)
    pp_dpm_pcie: bool
    xgmi_link_speed_gbps: int
    xgmi_link_width: int
    xgmi_max_bandwidth_mbs: int  # KFD io_link max_bandwidth for one peer
    # boards of one model that form an XGMI hive: an MI210 bridge joins up to 4 cards, a node board
    # cables up to 4 MI250X packages, a baseboard carries 8 MI300-class sockets
    hive_boards: int
    # power (W): package level; MI250X's two dies share one package budget
    power_cap: int
    power_idle: int
    power_compute: int  # steady training compute phase, whole package
    power_comm: int  # communication phase, whole package
    # thermals: ambient and thermal resistance junction <- die power (°C/W)
    ambient: float
    r_junction: float
    r_edge: float
    r_memory: float
    has_edge_sensor: bool
    limits: dict[str, ThermalLimits] = field(default_factory=dict)  # sensor -> limits
    # hwmon power file: power1_average (MI200) or power1_input (MI300X)
    hwmon_power_file: str = "power1_average"
    has_vddgfx: bool = True
    # KFD node properties
    gfx_target_version: int = 90010
    simd_count: int = 440
    array_count: int = 8
    cu_per_simd_array: int = 14
    num_xcc: int = 1
    kfd_name: str = "aldebaran"
    num_sdma_engines: int = 2
    num_sdma_xgmi_engines: int = 3
    compute_partitions: str = ""  # "SPX, DPX, QPX, CPX" when partitionable
    memory_partitions: str = ""
    # ras blocks with an <blk>_err_count file
    ras_blocks: tuple[str, ...] = ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")
    firmware: dict[str, int] = field(default_factory=dict)
    # MI300-class gpu_metrics: HBM peak bandwidth at the top memory clock (GB/s), JPEG rings per decoder
    mem_max_bandwidth_gbs: int = 0
    jpeg_rings_per_vcn: int = 8
    # SR-IOV: the PCI device id of the board's virtual function (pci.ids "... VF"), 0 when the
    # simulator has no guest mode for it
    vf_device_id: int = 0
    # the board/ sysfs group of MP1 13.0.12 parts: the node's power limit ceiling (W) the firmware
    # reports for a baseboard of `hive_boards` of these boards, 0 for a part without the group
    max_node_power_limit: int = 0

    @property
    def metrics_version(self) -> tuple[int, int]:
        """The gpu_metrics table a current kernel writes for this ASIC: the simulator's default."""
        return KERNEL_TABLES[self.smu_driver][-1][1]


# AMDGPU_RAS_BLOCK__* (amdgpu_ras.h), in bit order: ras/features is a mask of these bits.
_RAS_BLOCKS = (
    "umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl", "df", "smn", "sem", "mp0", "mp1",
    "fuse", "mca", "vcn", "jpeg",
)  # fmt: skip
RAS_BLOCK_BITS = {block: bit for bit, block in enumerate(_RAS_BLOCKS)}

_ALDEBARAN_FW = {
    "asd": 0x21000095,
    "me": 0x00000000,  # hidden: gfx 9.4.2 has no graphics ME; the kernel hides zero versions
    "mec": 0x0000004C,
    "mec2": 0x0000004C,
    "pfp": 0x00000000,
    "rlc": 0x00000011,
    "rlc_srlc": 0x00000001,
    "rlc_srlg": 0x00000001,
    "rlc_srls": 0x00000001,
    "sdma": 0x00000008,
    "sdma2": 0x00000008,
    "smc": 0x00443F00,
    "sos": 0x00270082,
    "ta_ras": 0x1B000116,
    "ta_xgmi": 0x20000028,
    "vcn": 0x0110101B,
}

_AQUA_VANJARAM_FW = {
    "asd": 0x21000110,
    "mec": 0x00000097,
    "rlc": 0x00000067,
    "sdma": 0x00000013,
    "smc": 0x00556B00,
    "sos": 0x00360060,
    "ta_ras": 0x1B00013E,
    "ta_xgmi": 0x20000033,
    "vcn": 0x0111001D,
}

MI210 = AsicModel(
    name="MI210",
    product_name="AMD Instinct MI210",
    product_number="102-D67302-00",
    asic="aldebaran",
    device_id=0x740F,
    subsystem_device=0x0C34,
    revision=0x02,
    pci_class=0x038000,
    gcds_per_package=1,
    board_type="cem",
    vbios="113-D67301-063",
    smu_driver="aldebaran_ppt.c",
    metrics_versions=((1, 3),),
    vram_bytes=64 * GIB,
    vram_vendor="hynix",
    gtt_bytes=396 * GIB,
    sclk_range=(500, 1700),
    mclk_levels=(400, 700, 1200, 1600),
    fclk_levels=(400, 800, 1200, 1600),
    socclk_levels=(500, 750, 1090),
    vclk_levels=(914, 1333),
    dclk_levels=(711, 1143),
    sclk_deep_sleep=None,
    pcie_gts=16.0,
    pcie_width=16,
    pcie_bw_file=True,
    pp_dpm_pcie=True,
    xgmi_link_speed_gbps=25,
    xgmi_link_width=16,
    xgmi_max_bandwidth_mbs=50000,
    hive_boards=4,
    power_cap=300,
    power_idle=42,
    power_compute=286,
    power_comm=232,
    ambient=30.0,
    r_junction=0.148,
    r_edge=0.10,
    r_memory=0.11,
    has_edge_sensor=True,
    limits={
        "edge": ThermalLimits(100, 105),
        "junction": ThermalLimits(105, 110),
        "memory": ThermalLimits(95, 100),
    },
    simd_count=416,
    cu_per_simd_array=13,
    firmware=_ALDEBARAN_FW,
)

# MI250X: two Aldebaran dies on one OAM package sharing one power budget
MI250X = replace(
    MI210,
    name="MI250X",
    product_name="AMD Instinct MI250X",
    product_number="102-D65209-00",
    device_id=0x740C,
    subsystem_device=0x0B0C,
    revision=0x01,
    gcds_per_package=2,
    board_type="oam",
    vbios="113-D65201-042",
    vram_vendor="samsung",
    power_cap=560,
    power_idle=92,
    power_compute=532,
    power_comm=430,
    r_junction=0.172,  # per die, of that die's half of package power
    r_edge=0.115,
    r_memory=0.12,
    limits={**MI210.limits, "junction": ThermalLimits(110, 115)},
    simd_count=440,
    cu_per_simd_array=14,
)

MI300X = AsicModel(
    name="MI300X",
    product_name="AMD Instinct MI300X",
    product_number="102-G30211-00",
    asic="aqua_vanjaram",
    device_id=0x74A1,
    subsystem_device=0x74A1,
    revision=0x00,
    pci_class=0x120000,
    gcds_per_package=1,
    board_type="oam",
    vbios="113-M3000100-102",
    smu_driver="smu_v13_0_6_ppt.c",
    # older tables are selectable with "MI300X:gpu_metrics=1.5"; 1.4 and 1.6 were written only by
    # drivers between releases (a released kernel went 1.3 -> 1.5 -> 1.7)
    metrics_versions=((1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (1, 9)),
    vram_bytes=192 * GIB,
    vram_vendor="hynix",
    gtt_bytes=1510 * GIB,
    sclk_range=(500, 2100),
    mclk_levels=(900, 1100, 1200, 1300),
    fclk_levels=(1200, 1400, 1600, 2000),
    socclk_levels=(500, 1000, 1143),
    vclk_levels=(914, 1333),
    dclk_levels=(711, 1143),
    sclk_deep_sleep=133,
    pcie_gts=32.0,
    pcie_width=16,
    pcie_bw_file=False,
    pp_dpm_pcie=False,
    xgmi_link_speed_gbps=32,
    xgmi_link_width=16,
    xgmi_max_bandwidth_mbs=64000,
    hive_boards=8,
    power_cap=750,
    power_idle=148,
    power_compute=712,
    power_comm=575,
    ambient=30.0,
    r_junction=0.068,
    r_edge=0.05,
    r_memory=0.052,
    has_edge_sensor=False,
    limits={
        "junction": ThermalLimits(100, 105),
        "memory": ThermalLimits(95, 105),
    },
    hwmon_power_file="power1_input",
    has_vddgfx=False,
    gfx_target_version=90402,
    simd_count=1216,
    array_count=32,
    cu_per_simd_array=10,
    num_xcc=8,
    kfd_name="ip discovery",
    num_sdma_xgmi_engines=14,
    compute_partitions="SPX, DPX, QPX, CPX",
    memory_partitions="NPS1, NPS4",
    ras_blocks=("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl", "vcn", "jpeg"),
    firmware=_AQUA_VANJARAM_FW,
    mem_max_bandwidth_gbs=5300,
    vf_device_id=0x74B5,
)

# MI325X: the same GC 9.4.3 / SMU 13.0.6 silicon as MI300X with 256 GB HBM3E and a 1000 W board
# (PCI device 0x74a5); its driver path, and so its gpu_metrics versions, are MI300X's.
MI325X = replace(
    MI300X,
    name="MI325X",
    product_name="AMD Instinct MI325X",
    product_number="102-G30233-00",
    device_id=0x74A5,
    subsystem_device=0x74A5,
    vbios="113-M3250101-100",
    vram_bytes=256 * GIB,
    vram_vendor="samsung",
    gtt_bytes=2008 * GIB,
    mclk_levels=(900, 1100, 1200, 1400),
    power_cap=1000,
    power_idle=165,
    power_compute=950,
    power_comm=760,
    r_junction=0.055,
    r_edge=0.04,
    r_memory=0.043,
    mem_max_bandwidth_gbs=6000,
    vf_device_id=0x74B9,
)

_MI350_FW = {**_AQUA_VANJARAM_FW, "smc": 0x00684700, "sos": 0x00400030, "mec": 0x000000A5}

# MI350X / MI355X (GC 9.5.0 "gfx950", MP1 13.0.12, CDNA 4): 8 XCDs of 32 CUs, 288 GB HBM3E, PCIe
# Gen5. The PCI device ids (0x75a0, 0x75a3) are pci.ids' (2026.10); the board numbers are what
# public listings give. MP1 13.0.12 writes the board/ group (amdgpu_pm.c: baseboard and GPU-board
# temperature tables from 6.18, node power and its limits from 6.19).
MI355X = replace(
    MI300X,
    name="MI355X",
    product_name="AMD Instinct MI355X",
    product_number="102-G35501-00",
    asic="gfx950",
    device_id=0x75A3,
    subsystem_device=0x75A3,
    vbios="113-M3550101-100",
    smu_driver="smu_v13_0_12_ppt.c",
    metrics_versions=((1, 8), (1, 9)),
    vram_bytes=288 * GIB,
    vram_vendor="samsung",
    gtt_bytes=2260 * GIB,
    sclk_range=(500, 2400),
    mclk_levels=(900, 1200, 1600, 2000),
    xgmi_link_speed_gbps=38,
    xgmi_max_bandwidth_mbs=76800,
    power_cap=1400,
    power_idle=210,
    power_compute=1330,
    power_comm=1050,
    r_junction=0.044,
    r_edge=0.032,
    r_memory=0.035,
    gfx_target_version=90500,
    simd_count=1024,
    cu_per_simd_array=8,
    memory_partitions="NPS1, NPS2",
    firmware=_MI350_FW,
    mem_max_bandwidth_gbs=8000,
    jpeg_rings_per_vcn=10,
    vf_device_id=0,  # pci.ids lists no MI350-class VF
    max_node_power_limit=8 * 1400,
)
MI350X = replace(
    MI355X,
    name="MI350X",
    product_name="AMD Instinct MI350X",
    product_number="102-G35001-00",
    device_id=0x75A0,
    subsystem_device=0x75A0,
    vbios="113-M3500101-100",
    power_cap=1000,
    power_idle=180,
    power_compute=950,
    power_comm=770,
    r_junction=0.06,
    r_edge=0.045,
    r_memory=0.048,
    max_node_power_limit=8 * 1000,
)

# What a virtual function shows in an SR-IOV guest (a real MI300X VF: VBIOS 113-MI3SRIOV-001): the
# host keeps the FRU EEPROM, the firmware versions and the unique id to itself.
GUEST_VBIOS = "113-MI3SRIOV-001"

ASICS: dict[str, AsicModel] = {m.name: m for m in (MI210, MI250X, MI300X, MI325X, MI350X, MI355X)}
