"""The static part of the simulated sysfs tree: PCI devices, class links, hwmon, KFD topology.

Written once by write_static(); render.py supplies the files that change. The shapes are what
real readers need (see reference/real-tools-on-fake-sysfs.md): class/drm/cardN are relative
symlinks whose target contains the BDF, cards are numbered from 0 without gaps, every KFD node
(CPU nodes too) has an io_links/ folder, GPU<->GPU io_links are XGMI (type 11) only, and hwmon
labels are exactly edge/junction/mem with in0_label = vddgfx.

A partitioned MI300-class socket (DPX/QPX/CPX) keeps partition 0 on its PCI device; partitions
1..N-1 are platform devices (devices/platform/amdgpu_xcp_<n>) holding only their DRM minors,
uevent and modalias; KFD has one node per partition (location_id = partition << 28 | BDF bits,
its share of XCCs and CUs, its render minor, the socket's unique_id). mem_info_* stay device-wide.
"""

from __future__ import annotations

from exporter.simulator.asics import RAS_BLOCK_BITS
from exporter.simulator.atomic_tree import AtomicTree
from exporter.simulator.file_contents import hwmon_dir, pp_dpm_pcie
from exporter.simulator.fleet import _COMPATIBLE_NPS, CPU_SOCKETS, GcdLayout, PartitionLayout, xgmi_hops

DRIVER_VERSION = "6.7.0"  # amdgpu DKMS module version of ROCm 6.2
KFD_DIR = "devices/virtual/kfd/kfd"
DRM_MAJOR = 226
KFD_IO_LINK_PCIE = 2
KFD_IO_LINK_QPI = 5  # CPU<->CPU links of the virtual CRAT
KFD_IO_LINK_XGMI = 11
KFD_PCIE_WEIGHT = 20  # GPU <-> its CPU node
KFD_XGMI_WEIGHT = 15  # per XGMI hop
KFD_INTRA_SOCKET_WEIGHT = 13  # between two partitions of one socket (KFD_CRAT_INTRA_SOCKET_WEIGHT)
CPU_NODE_DISTANCE = 32  # SLIT distance between the two sockets
CPU_CORES_PER_SOCKET = 64
CPU_NODE_MEMORY = 256 * 1024**3
_HWMON_SENSORS = (("edge", 1, "edge"), ("junction", 2, "junction"), ("memory", 3, "mem"))


def write_static(tree: AtomicTree, gcds: list[GcdLayout]) -> None:
    tree.write("module/amdgpu/initstate", "live\n")
    tree.write("module/amdgpu/version", f"{DRIVER_VERSION}\n")
    tree.write("module/amdgpu/parameters/ppfeaturemask", "0xfff7bfff\n")  # the kernel's default
    tree.write("module/amdgpu/parameters/bad_page_threshold", "-1\n")  # the default: the driver's formula
    tree.mkdir("bus/pci/drivers/amdgpu")
    _write_cpu_hwmons(tree)
    for root in sorted({g.pci_root for g in gcds}):
        tree.mkdir(f"devices/{root}")
    for gcd in gcds:
        _write_bridge(tree, gcd)
        _write_pci_device(tree, gcd)
        _write_amdgpu_attributes(tree, gcd, gcds)
        _write_minors(tree, gcd.device_relpath, gcd.partitions[0])
        _write_partition_devices(tree, gcd)
        _write_hwmon(tree, gcd)
    _write_kfd(tree, gcds)


def _write_cpu_hwmons(tree: AtomicTree) -> None:
    # k10temp sensors register before amdgpu loads, so the GPUs' hwmon numbers do not start at 0
    for socket in range(CPU_SOCKETS):
        dev = f"devices/pci0000:00/0000:00:{0x18 + socket:02x}.3"
        tree.write_files(dev, {"vendor": "0x1022\n", "device": "0x14b3\n", "class": "0x060000\n"})
        hw = f"{dev}/hwmon/hwmon{socket}"
        tctl = f"{46250 + 1375 * socket}\n"
        tree.write_files(hw, {"name": "k10temp\n", "temp1_input": tctl, "temp1_label": "Tctl\n"})
        tree.symlink(f"{hw}/device", dev)
        tree.symlink(f"class/hwmon/hwmon{socket}", hw)


def _write_bridge(tree: AtomicTree, gcd: GcdLayout) -> None:
    bridge = f"devices/{gcd.pci_root}/{gcd.bridge_bdf}"
    tree.write_files(bridge, {"vendor": "0x1022\n", "device": "0x1483\n", "class": "0x060400\n"})
    tree.symlink(f"bus/pci/devices/{gcd.bridge_bdf}", bridge)


def _write_pci_device(tree: AtomicTree, gcd: GcdLayout) -> None:
    m = gcd.model
    dev = gcd.device_relpath
    pci_id = f"1002:{m.device_id:04X}"
    subsys = f"1002:{m.subsystem_device:04X}"
    files = {
        "vendor": "0x1002\n",
        "device": f"0x{m.device_id:04x}\n",
        "subsystem_vendor": "0x1002\n",
        "subsystem_device": f"0x{m.subsystem_device:04x}\n",
        "revision": f"0x{m.revision:02x}\n",
        "class": f"0x{m.pci_class:06x}\n",
        "uevent": (
            f"DRIVER=amdgpu\nPCI_CLASS={m.pci_class:X}\nPCI_ID={pci_id}\nPCI_SUBSYS_ID={subsys}\n"
            f"PCI_SLOT_NAME={gcd.bdf}\nMODALIAS=pci:v00001002d0000{m.device_id:04X}sv00001002"
            f"sd0000{m.subsystem_device:04X}bc{m.pci_class >> 16:02X}sc{(m.pci_class >> 8) & 0xFF:02X}i00\n"
        ),
        "numa_node": f"{gcd.numa_node}\n",
        "enable": "1\n",
        "current_link_speed": f"{m.pcie_gts:.1f} GT/s PCIe\n",
        "current_link_width": f"{m.pcie_width}\n",
        "max_link_speed": f"{m.pcie_gts:.1f} GT/s PCIe\n",
        "max_link_width": f"{m.pcie_width}\n",
    }
    tree.write_files(dev, files)
    tree.symlink(f"{dev}/driver", "bus/pci/drivers/amdgpu")
    tree.symlink(f"{dev}/subsystem", "bus/pci")
    tree.symlink(f"bus/pci/devices/{gcd.bdf}", dev)
    tree.symlink(f"bus/pci/drivers/amdgpu/{gcd.bdf}", dev)


def _write_amdgpu_attributes(tree: AtomicTree, gcd: GcdLayout, gcds: list[GcdLayout]) -> None:
    m = gcd.model
    dev = gcd.device_relpath
    files = {
        "mem_info_vram_total": f"{m.vram_bytes}\n",
        "mem_info_vis_vram_total": f"{m.vram_bytes}\n",
        "mem_info_gtt_total": f"{m.gtt_bytes}\n",
        "mem_info_vram_vendor": f"{m.vram_vendor}\n",
        # the kernel prints nothing for a unique id of 0 (what a VF is given)
        "unique_id": f"{gcd.unique_id:016x}\n" if gcd.unique_id else "",
        "vbios_version": f"{m.vbios}\n",
        "board_info": f"type : {m.board_type}\n",
        "power_dpm_force_performance_level": "auto\n",
        "power_dpm_state": "performance\n",
        "ras/features": f"feature mask: 0x{sum(1 << RAS_BLOCK_BITS[b] for b in m.ras_blocks):x}\n",
        "xgmi_device_id": f"{gcd.xgmi_device_id}\n",
        "xgmi_physical_id": f"{gcd.xgmi_physical_id}\n",
        "xgmi_error": "0\n",
    }
    if not gcd.guest:  # the FRU EEPROM: a VF's driver does not read it
        files.update(
            {
                "serial_number": f"{gcd.serial}\n",
                "product_name": f"{m.product_name}\n",
                "product_number": f"{m.product_number}\n",
                "manufacturer": "AMD\n",
            }
        )
    if m.max_node_power_limit:
        # board/ (MP1 13.0.12): the ceiling is static; render.py writes the rest every tick
        files["board/max_node_power_limit"] = f"{m.max_node_power_limit}\n"
    for block, version in m.firmware.items():
        if version:  # newer kernels hide firmware whose version reads 0
            files[f"fw_version/{block}_fw_version"] = f"0x{version:08x}\n"
    if m.pp_dpm_pcie:
        files["pp_dpm_pcie"] = pp_dpm_pcie(m.pcie_gts, m.pcie_width)
    if m.compute_partitions:
        files["current_compute_partition"] = f"{gcd.compute_partition}\n"
        files["available_compute_partition"] = f"{available_compute_modes(gcd)}\n"
        files["current_memory_partition"] = f"{gcd.memory_partition}\n"
        files["available_memory_partition"] = f"{m.memory_partitions}\n"
    tree.write_files(dev, files)
    if gcd.hive_id:
        # the hive folder is real on the first device of the hive and a link on the others
        first = gcds[gcd.hive_members[0]]
        if first.index == gcd.index:
            tree.write(f"{dev}/xgmi_hive_info/xgmi_hive_id", f"{gcd.hive_id}\n")
        else:
            tree.symlink(f"{dev}/xgmi_hive_info", f"{first.device_relpath}/xgmi_hive_info")


DEVCOREDUMP_DIR = "devices/virtual/devcoredump"


def devcoredump_text(monotonic_seconds: float) -> str:
    """The head of amdgpu's device coredump (amdgpu_dev_coredump.c): `time:` is CLOCK_MONOTONIC at the reset."""
    return (
        "**** AMDGPU Device Coredump ****\nversion: 1\nkernel: 6.8.0-simulated\nmodule: amdgpu\n"
        f"time: {monotonic_seconds:.9f}\nprocess_name: python3 PID: 4242\n\n"
        "Ring timed out details\nIP Type: 0 Ring Name: gfx_0.0.0\n\nVRAM is lost due to GPU reset!\n"
    )


def write_devcoredump(tree: AtomicTree, index: int, gcd: GcdLayout, monotonic_seconds: float) -> None:
    """devcdN: the dump (data), the device it came from (failing_device) and the device's link back to it."""
    name = f"devcd{index}"
    folder = f"{DEVCOREDUMP_DIR}/{name}"
    tree.write(f"{folder}/data", devcoredump_text(monotonic_seconds))
    tree.write(f"{folder}/uevent", "")
    tree.symlink(f"{folder}/failing_device", gcd.device_relpath)
    tree.symlink(f"class/devcoredump/{name}", folder)
    tree.symlink(f"{gcd.device_relpath}/devcoredump", folder)


def remove_devcoredump(tree: AtomicTree, index: int, gcd: GcdLayout) -> None:
    """What the kernel does 5 minutes after a dump was made (or when one writes to its data)."""
    name = f"devcd{index}"
    tree.remove(f"{gcd.device_relpath}/devcoredump")
    tree.remove(f"class/devcoredump/{name}")
    tree.remove(f"{DEVCOREDUMP_DIR}/{name}")


def available_compute_modes(gcd: GcdLayout) -> str:
    """available_compute_partition: the ASIC's modes that the current memory mode allows."""
    modes = [mode.strip() for mode in gcd.model.compute_partitions.split(",")]
    return ", ".join(mode for mode in modes if gcd.memory_partition in _COMPATIBLE_NPS[mode])


def _write_minors(tree: AtomicTree, dev: str, part: PartitionLayout) -> None:
    for name, minor in ((part.card, part.card_minor), (part.render, part.render_minor)):
        node = f"{dev}/drm/{name}"
        uevent = f"MAJOR={DRM_MAJOR}\nMINOR={minor}\nDEVNAME=dri/{name}\nDEVTYPE=drm_minor\n"
        tree.write_files(node, {"dev": f"{DRM_MAJOR}:{minor}\n", "uevent": uevent})
        tree.symlink(f"{node}/device", dev)
        tree.symlink(f"{node}/subsystem", "class/drm")
        tree.symlink(f"class/drm/{name}", node)


def _write_partition_devices(tree: AtomicTree, gcd: GcdLayout) -> None:
    """Partitions 1..N-1: bare platform devices holding only their DRM minors (the driver redirects
    their ioctls to the socket's PCI device and gives them no sysfs attributes of their own)."""
    for part in gcd.partitions[1:] + gcd.idle_xcp_nodes:
        dev = part.platform_relpath
        # platform_device_register_simple("amdgpu_xcp", id): the modalias carries the bare name;
        # the DKMS spelling registers "amdgpu_xcp_<n>" as the name itself.
        name = part.platform_device.partition(".")[0]
        modalias = f"platform:{name}\n"
        tree.write_files(dev, {"uevent": f"MODALIAS={modalias}", "modalias": modalias, "driver_override": "(null)\n"})
        tree.symlink(f"{dev}/subsystem", "bus/platform")
        tree.symlink(f"bus/platform/devices/{part.platform_device}", dev)
        _write_minors(tree, dev, part)


def _write_hwmon(tree: AtomicTree, gcd: GcdLayout) -> None:
    m = gcd.model
    hw = hwmon_dir(gcd)
    primary = gcd.die == 0
    cap_uw = m.power_cap * 1_000_000 if primary else 0
    files = {
        "name": "amdgpu\n",
        "power1_label": "PPT\n",
        "power1_cap": f"{cap_uw}\n",
        "power1_cap_default": f"{cap_uw}\n",
        # the secondary die's limit reads 0, but its maximum is the package PPT limit
        "power1_cap_max": f"{m.power_cap * 1_000_000}\n",
        "power1_cap_min": "0\n",
        "freq1_label": "sclk\n",
        "freq2_label": "mclk\n",
    }
    for sensor, index, label in _HWMON_SENSORS:
        if sensor == "edge" and not m.has_edge_sensor:
            continue
        limits = m.limits[sensor]
        files[f"temp{index}_label"] = f"{label}\n"
        files[f"temp{index}_crit"] = f"{limits.critical * 1000}\n"
        files[f"temp{index}_crit_hyst"] = "-273150\n"
        files[f"temp{index}_emergency"] = f"{limits.emergency * 1000}\n"
    if m.has_vddgfx:
        files["in0_label"] = "vddgfx\n"
    tree.write_files(hw, files)
    tree.symlink(f"{hw}/device", gcd.device_relpath)
    tree.symlink(f"{hw}/subsystem", "class/hwmon")
    tree.symlink(f"class/hwmon/hwmon{gcd.hwmon_index}", hw)


def kfd_partition_peers(
    gcd: GcdLayout, part: PartitionLayout, gcds: list[GcdLayout]
) -> list[tuple[GcdLayout, PartitionLayout, int]]:
    """The XGMI io_links of one partition's KFD node, in KFD node order: every other partition of
    its own socket (intra-socket weight) and every partition of each hive peer (15 per hop)."""
    peers: list[tuple[GcdLayout, PartitionLayout, int]] = []
    hive = gcd.hive_members if gcd.hive_id else ()
    weights = {i: KFD_XGMI_WEIGHT * xgmi_hops(gcd, gcds[i], len(hive)) for i in hive if i != gcd.index}
    weights[gcd.index] = KFD_INTRA_SOCKET_WEIGHT
    for other in gcds:
        if other.index not in weights:
            continue
        for other_part in other.partitions:
            if other.index == gcd.index and other_part.index == part.index:
                continue
            peers.append((other, other_part, weights[other.index]))
    return peers


def _io_link(node_from: int, node_to: int, link_type: int, weight: int, min_bw: int, max_bw: int) -> str:
    return (
        f"type {link_type}\nversion_major 0\nversion_minor 0\nnode_from {node_from}\nnode_to {node_to}\n"
        f"weight {weight}\nmin_latency 0\nmax_latency 0\nmin_bandwidth {min_bw}\nmax_bandwidth {max_bw}\n"
        f"recommended_transfer_size 0\nrecommended_sdma_engine_id_mask 0\nflags 3\n"
    )


def _pcie_bandwidth_mbs(gcd: GcdLayout) -> int:
    return int(gcd.model.pcie_gts * gcd.model.pcie_width * 1000 / 8 * 128 / 130)


def _write_kfd(tree: AtomicTree, gcds: list[GcdLayout]) -> None:
    tree.symlink("class/kfd/kfd", KFD_DIR)
    tree.write_files(KFD_DIR, {"dev": "238:0\n", "uevent": "MAJOR=238\nMINOR=0\nDEVNAME=kfd\n"})
    tree.mkdir(f"{KFD_DIR}/proc")
    topo = f"{KFD_DIR}/topology"
    tree.write(f"{topo}/generation_id", "1\n")
    tree.write(f"{topo}/system_properties", "platform_oem 0\nplatform_id 0\nplatform_rev 0\n")
    for socket in range(CPU_SOCKETS):
        node = f"{topo}/nodes/{socket}"
        links = [
            _io_link(socket, other, KFD_IO_LINK_QPI, CPU_NODE_DISTANCE, 0, 0)
            for other in range(CPU_SOCKETS)
            if other != socket
        ]
        links += [
            _io_link(socket, part.kfd_node, KFD_IO_LINK_PCIE, KFD_PCIE_WEIGHT, 312, _pcie_bandwidth_mbs(g))
            for g in gcds
            if g.numa_node == socket
            for part in g.partitions
        ]
        bank = f"heap_type 0\nsize_in_bytes {CPU_NODE_MEMORY}\nflags 0\nwidth 72\nmem_clk_max 3200\n"
        _write_kfd_node(tree, node, 0, "", _cpu_properties(socket, len(links)), links, bank)
    for gcd in gcds:
        for part in gcd.partitions:
            node = f"{topo}/nodes/{part.kfd_node}"
            links = [
                _io_link(part.kfd_node, gcd.numa_node, KFD_IO_LINK_PCIE, KFD_PCIE_WEIGHT, 312, _pcie_bandwidth_mbs(gcd))
            ]
            bandwidth = gcd.model.xgmi_max_bandwidth_mbs
            links += [
                _io_link(part.kfd_node, peer_part.kfd_node, KFD_IO_LINK_XGMI, weight, bandwidth // 4, bandwidth)
                for _peer, peer_part, weight in kfd_partition_peers(gcd, part, gcds)
            ]
            properties = _gpu_properties(gcd, part, len(links))
            bank = (
                f"heap_type 1\nsize_in_bytes {part.memory_bytes}\nflags 0\nwidth 4096\n"
                f"mem_clk_max {gcd.model.mclk_levels[-1]}\n"
            )
            _write_kfd_node(tree, node, part.gpu_id, gcd.model.kfd_name, properties, links, bank)


def _write_kfd_node(
    tree: AtomicTree, node: str, gpu_id: int, name: str, properties: str, links: list[str], bank: str
) -> None:
    tree.write_files(node, {"gpu_id": f"{gpu_id}\n", "name": f"{name}\n", "properties": properties})
    tree.mkdir(f"{node}/io_links")
    for i, link in enumerate(links):
        tree.write(f"{node}/io_links/{i}/properties", link)
    tree.write(f"{node}/mem_banks/0/properties", bank)


# The properties every KFD node prints first, in the driver's order (those not set read 0); a GPU
# node prints its own after them.
_NODE_PROPERTIES = (
    "cpu_cores_count", "simd_count", "mem_banks_count", "caches_count", "io_links_count", "p2p_links_count",
    "cpu_core_id_base", "simd_id_base", "max_waves_per_simd", "lds_size_in_kb", "gds_size_in_kb", "num_gws",
    "wave_front_size", "array_count", "simd_arrays_per_engine", "cu_per_simd_array", "simd_per_cu",
    "max_slots_scratch_cu", "gfx_target_version", "vendor_id", "device_id", "location_id", "domain",
    "drm_render_minor", "hive_id", "num_sdma_engines", "num_sdma_xgmi_engines", "num_sdma_queues_per_engine",
    "num_cp_queues",
)  # fmt: skip


def _cpu_properties(socket: int, io_links: int) -> str:
    props = dict.fromkeys(_NODE_PROPERTIES, 0)
    props.update(
        cpu_cores_count=CPU_CORES_PER_SOCKET,
        mem_banks_count=1,
        io_links_count=io_links,
        cpu_core_id_base=socket * CPU_CORES_PER_SOCKET,
        max_engine_clk_ccompute=3700,
    )
    return "".join(f"{k} {v}\n" for k, v in props.items())


def _gpu_properties(gcd: GcdLayout, part: PartitionLayout, io_links: int) -> str:
    m = gcd.model
    share = part.count
    # a partition owns its XCCs' CUs and its share of the SDMA engines (two per partition in CPX)
    sdma_total = m.num_sdma_engines + m.num_sdma_xgmi_engines
    props = dict.fromkeys(_NODE_PROPERTIES, 0)
    props.update(
        simd_count=m.simd_count // share,
        mem_banks_count=1,
        io_links_count=io_links,
        simd_id_base=2147487744 + 4096 * gcd.index + 256 * part.index,
        max_waves_per_simd=8,
        lds_size_in_kb=64,
        num_gws=64,
        wave_front_size=64,
        array_count=m.array_count // share,
        simd_arrays_per_engine=1,
        cu_per_simd_array=m.cu_per_simd_array,
        simd_per_cu=4,
        max_slots_scratch_cu=32,
        gfx_target_version=m.gfx_target_version,
        vendor_id=0x1002,
        device_id=m.device_id,
        location_id=gcd.partition_location_id(part.index),
        drm_render_minor=part.render_minor,
        hive_id=gcd.hive_id,
        num_sdma_engines=m.num_sdma_engines,
        num_sdma_xgmi_engines=max(0, sdma_total // share - m.num_sdma_engines),
        num_sdma_queues_per_engine=8,
        num_cp_queues=24,
        max_engine_clk_fcompute=m.sclk_range[1],
        local_mem_size=0,
        fw_version=m.firmware.get("mec", 0),
        capability=746586752,
        debug_prop=1495,
        sdma_fw_version=m.firmware.get("sdma", 0),
        unique_id=gcd.unique_id,
        num_xcc=part.xcc_count,
        max_engine_clk_ccompute=3700,
    )
    return "".join(f"{k} {v}\n" for k, v in props.items())
