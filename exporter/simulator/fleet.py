"""Fleet specs ("4xMI250X", "1xMI210,2xMI250X", "2xMI300X:CPX:NPS4") and the physical layout they imply.

The layout gives every GCD its identity: PCI address, card/hwmon/KFD numbers, serials, hive, and
for a partitioned MI300-class socket its compute partitions. It depends only on the spec (not on
the seed), so a fleet always looks the same.

Partitions are laid out as the amdgpu driver does it (amdgpu_xcp_drm.c, aqua_vanjaram.c): the
socket's PCI device keeps partition 0 (its cardN / renderD), partitions 1..N-1 are platform
devices named from one counter over the whole system (amdgpu_xcp_0, amdgpu_xcp_1, ..., in probe
order), each with its own DRM card and render minor; DRM minors and KFD nodes are handed out
device by device in probe (= BDF) order: a socket's primary node, then its partitions.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from exporter.simulator.asics import ASICS, GUEST_VBIOS, AsicModel

MAX_GCDS = 128
CPU_SOCKETS = 2
CPU_HWMON_COUNT = CPU_SOCKETS  # one k10temp per socket, numbered before the GPUs' hwmons
_ROOT_BUSES = (0x00, 0x40, 0x80, 0xC0)  # one PCI root complex per EPYC quadrant
_TERM = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9]+)\s*(?::\s*(.*))?$")

# Compute partition modes: name -> partitions of the socket (an 8-XCD MI300X: 1, 2, 4, 8).
COMPUTE_PARTITION_COUNTS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
MEMORY_PARTITION_COUNTS = {"NPS1": 1, "NPS2": 2, "NPS3": 3, "NPS4": 4, "NPS8": 8}
# Which memory modes each compute mode accepts (aqua_vanjaram.c, __aqua_vanjaram_is_valid_mode and
# the NPS masks of __aqua_vanjaram_get_px_mode_info in current kernels).
_COMPATIBLE_NPS = {
    "SPX": ("NPS1",),
    "DPX": ("NPS1", "NPS2"),
    "TPX": ("NPS1", "NPS3"),
    "QPX": ("NPS1", "NPS4"),
    "CPX": ("NPS1", "NPS4"),
}
# The key=value options of a fleet term: default, allowed values, and whether they need an ASIC with
# compute partitions. xcp_names: amdgpu_xcp_<n> (ROCm DKMS) or amdgpu_xcp.<n> (some
# kernels); xcp_metrics: per-partition xcp/xcp_metrics (newer drivers); xcp_nodes, serial: see FleetEntry.
_OPTIONS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "xcp_names": ("underscore", ("underscore", "dot"), False),
    "xcp_metrics": ("", ("1.0", "1.1"), True),
    "xcp_nodes": ("used", ("used", "all"), True),
    "serial": ("fru", ("fru", "unique_id"), False),
}
MAX_XCP = 8  # amdgpu_xcp_dev_alloc: a partitionable socket allocates xcp nodes 1..MAX_XCP-1 at load
MAX_RENDER_NODES = 128  # DRM render minors the simulator hands out (renderD128 ..)


@dataclass(frozen=True, slots=True)
class FleetEntry:
    count: int  # packages (boards)
    model: AsicModel
    metrics_version: tuple[int, int]
    compute_partition: str = ""  # "SPX".."CPX" on partitionable ASICs, "" otherwise
    memory_partition: str = ""  # "NPS1".. on partitionable ASICs, "" otherwise
    xcp_names: str = "underscore"  # spelling of the partition platform devices
    xcp_metrics: str = ""  # version of the per-partition xcp/xcp_metrics (newer drivers): "1.0" or "1.1"
    # "used": platform devices for the partitions in use only; "all": as amdgpu_xcp_dev_alloc does it,
    # MAX_XCP - 1 per socket whatever the mode (the unused ones have DRM minors but no KFD node)
    xcp_nodes: str = "used"
    # "fru": the board's FRU EEPROM gives serial_number (both dies of an MI250X share it);
    # "unique_id": no FRU, so the kernel falls back to each die's own unique_id, unpadded %llx
    serial: str = "fru"
    # an SR-IOV guest's view of the board: its virtual function ("MI300X:guest"), see guest_model()
    guest: bool = False

    @property
    def partitions(self) -> int:
        return COMPUTE_PARTITION_COUNTS.get(self.compute_partition, 1)

    @property
    def drm_nodes(self) -> int:
        """DRM card/render pairs per socket: its partitions, or MAX_XCP with xcp_nodes=all."""
        return MAX_XCP if self.xcp_nodes == "all" else self.partitions

    def __str__(self) -> str:
        text = f"{self.count}x{self.model.name}"
        default_compute, default_memory = _default_modes(self.model)
        if self.compute_partition != default_compute:
            text += f":{self.compute_partition}"
        if self.memory_partition != default_memory:
            text += f":{self.memory_partition}"
        if self.guest:
            text += ":guest"
        options = []
        if self.metrics_version != self.model.metrics_version:
            options.append(f"gpu_metrics={self.metrics_version[0]}.{self.metrics_version[1]}")
        for key, (default, _values, _partitions) in _OPTIONS.items():
            if getattr(self, key) != default:
                options.append(f"{key}={getattr(self, key)}")
        if options:
            text += ":" + ";".join(options)
        return text


def _default_modes(model: AsicModel) -> tuple[str, str]:
    if not model.compute_partitions:
        return "", ""
    return "SPX", "NPS1"


@dataclass(frozen=True, slots=True)
class FleetSpec:
    entries: tuple[FleetEntry, ...]

    @property
    def gcd_count(self) -> int:
        return sum(e.count * e.model.gcds_per_package for e in self.entries)

    @property
    def device_count(self) -> int:
        """GPUs as ROCm numbers them: every GCD, and every compute partition of a partitioned socket."""
        return sum(e.count * e.model.gcds_per_package * e.partitions for e in self.entries)

    @property
    def render_node_count(self) -> int:
        return sum(e.count * e.model.gcds_per_package * e.drm_nodes for e in self.entries)

    def __str__(self) -> str:
        return ",".join(str(e) for e in self.entries)


def parse_fleet(spec: str) -> FleetSpec:
    """Parse "4xMI250X", "MI210", "1xMI210,2xMI250X", "MI300X:gpu_metrics=1.6", "2xMI300X:CPX:NPS4";
    ValueError (one line) if bad."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty fleet spec: expected e.g. '4xMI250X' or '1xMI210,2xMI250X'")
    entries = [_parse_term(term, spec) for term in spec.split(",")]
    fleet = FleetSpec(tuple(entries))
    if fleet.gcd_count > MAX_GCDS:
        raise ValueError(f"fleet spec {spec!r} has {fleet.gcd_count} GCDs; at most {MAX_GCDS} are supported")
    if fleet.render_node_count > MAX_RENDER_NODES:
        raise ValueError(
            f"fleet spec {spec!r} needs {fleet.render_node_count} DRM render nodes (partitions included);"
            f" at most {MAX_RENDER_NODES} DRM render nodes are supported"
        )
    return fleet


def _parse_term(term: str, spec: str) -> FleetEntry:
    match = _TERM.match(term)
    if not match:
        raise ValueError(f"bad fleet term {term.strip()!r} in {spec!r}: expected [N x]MODEL, e.g. '2xMI250X'")
    count_text, name, options = match.groups()
    model = ASICS.get(name.upper())
    if model is None:
        known = ", ".join(ASICS)
        raise ValueError(f"unknown GPU model {name!r} in fleet spec {spec!r}: known models are {known}")
    count = int(count_text) if count_text is not None else 1
    if count < 1:
        raise ValueError(f"fleet term {term.strip()!r}: the count must be at least 1")
    version = model.metrics_version
    modes = dict(zip(("compute", "memory"), _default_modes(model), strict=True))
    chosen = {key: default for key, (default, _values, _partitions) in _OPTIONS.items()}
    seen: set[str] = set()
    guest = False
    tokens = re.split(r"[:;]", options) if options else []  # "MI300X:" alone was always accepted
    for option in tokens:
        word = option.strip()
        if not word:
            raise ValueError(f"empty option in fleet term {term.strip()!r}: options are separated by one ':'")
        key, sep, value = (part.strip() for part in word.partition("="))
        upper = word.upper()
        if not sep and (upper in COMPUTE_PARTITION_COUNTS or upper in MEMORY_PARTITION_COUNTS):
            kind = "compute" if upper in COMPUTE_PARTITION_COUNTS else "memory"
            if kind in seen:
                raise ValueError(f"fleet term {term.strip()!r} gives two {kind} partition modes")
            seen.add(kind)
            offered = model.compute_partitions if kind == "compute" else model.memory_partitions
            if not offered:
                raise ValueError(f"{model.name} has no {kind} partitions: drop {word!r} from {term.strip()!r}")
            if upper not in [m.strip() for m in offered.split(",")]:
                raise ValueError(f"{model.name} has no {kind} partition mode {word!r}: it offers {offered}")
            modes[kind] = upper
        elif not sep and upper in ("GUEST", "VF"):
            if not model.vf_device_id:
                raise ValueError(f"{model.name} has no simulated virtual function: drop {word!r} from {term.strip()!r}")
            guest = True
        elif sep and key == "gpu_metrics":
            version = _parse_metrics_version(value, model)
        elif sep and key in _OPTIONS:
            _default, values, needs_partitions = _OPTIONS[key]
            if needs_partitions and not model.compute_partitions:
                raise ValueError(f"{model.name} has no compute partitions, so no {key}")
            if value not in values:
                raise ValueError(f"bad {key}={value} for {model.name}: expected {' or '.join(values)}")
            chosen[key] = value
        else:
            raise ValueError(f"unknown option {word!r} for {model.name}: expected {options_help(model)}")
    compute, memory = modes["compute"], modes["memory"]
    if compute and memory not in _COMPATIBLE_NPS[compute]:
        allowed = " or ".join(m for m in _COMPATIBLE_NPS[compute] if m in model.memory_partitions)
        raise ValueError(
            f"{model.name} cannot run {compute} with {memory} (the driver rejects it): {compute} takes {allowed}"
        )
    if compute and model.num_xcc % COMPUTE_PARTITION_COUNTS[compute]:
        raise ValueError(f"{model.name} has {model.num_xcc} XCDs, which {compute} cannot split evenly")
    return FleetEntry(count, model, version, compute, memory, **chosen, guest=guest)


def options_help(model: AsicModel) -> str:
    """The options a fleet term of `model` takes, for messages and --help."""
    modes = [m.replace(", ", "|") for m in (model.compute_partitions, model.memory_partitions) if m]
    if model.vf_device_id:
        modes.append("guest")
    versions = "|".join(f"{a}.{b}" for a, b in model.metrics_versions)
    default = f"{model.metrics_version[0]}.{model.metrics_version[1]}"
    others = [
        f"{key}={'|'.join(v for v in values if v != default_value)}"
        for key, (default_value, values, needs) in _OPTIONS.items()
        if model.compute_partitions or not needs
    ]
    return ", ".join([*modes, f"gpu_metrics={versions} (default {default})", *others])


def _parse_metrics_version(text: str, model: AsicModel) -> tuple[int, int]:
    allowed = ", ".join(f"{a}.{b}" for a, b in model.metrics_versions)
    fmt, _, content = text.partition(".")
    if not (fmt.isdecimal() and content.isdecimal()):
        raise ValueError(f"bad gpu_metrics version {text!r} for {model.name}: expected one of {allowed}")
    version = (int(fmt), int(content))
    if version not in model.metrics_versions:
        raise ValueError(f"the simulator writes no gpu_metrics {text} for {model.name}: expected one of {allowed}")
    return version


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """One compute partition (XCP) of a socket: its own DRM minors, KFD node and gpu_id.

    Partition 0 is the PCI device itself; the others are platform devices (`platform_device`).
    A socket that is not partitioned (MI200, or SPX) has exactly one, partition 0.
    """

    index: int  # 0..count-1
    count: int  # partitions of the socket
    card_minor: int  # DRM primary minor: cardN
    render_minor: int  # renderD<minor>
    kfd_node: int
    gpu_id: int
    platform_device: str  # "amdgpu_xcp_3" / "amdgpu_xcp.3"; "" for partition 0
    xcc_first: int  # first XCC (XCD) of this partition
    xcc_count: int
    memory_bytes: int  # the KFD memory bank: the partition's NUMA memory partition (device-wide in NPS1)

    @property
    def card(self) -> str:
        return f"card{self.card_minor}"

    @property
    def render(self) -> str:
        return f"renderD{self.render_minor}"

    @property
    def platform_relpath(self) -> str:
        return f"devices/platform/{self.platform_device}"


@dataclass(frozen=True, slots=True)
class GcdLayout:
    """Where and what one GCD (a PCI function: an MI250X die, an MI300X socket) is.

    `index` is its position in PCI BDF order (= card number when no socket is partitioned).
    """

    index: int
    model: AsicModel
    metrics_version: tuple[int, int]
    package_index: int
    die: int
    bdf: str  # "0000:c1:00.0"
    bridge_bdf: str  # root port above it
    root_bus: int
    numa_node: int
    hwmon_index: int
    unique_id: int
    serial: str
    xgmi_device_id: int
    hive_id: int  # 0 when not part of a multi-device hive
    xgmi_physical_id: int
    hive_members: tuple[int, ...]  # GCD indices in the same hive (including this one)
    compute_partition: str = ""  # "" on ASICs without partitions
    memory_partition: str = ""
    partitions: tuple[PartitionLayout, ...] = ()  # partition 0 first; always at least one once laid out
    xcp_metrics_version: tuple[int, int] | None = None  # xcp/xcp_metrics per partition, when the driver has it
    # xcp platform devices allocated but not in use in the current mode (xcp_nodes=all): their DRM
    # minors exist, KFD has no node for them. PartitionLayout with kfd_node/gpu_id -1.
    idle_xcp_nodes: tuple[PartitionLayout, ...] = ()
    package_id: str = ""  # the package's identity: the board serial, or die 0's serial without a FRU
    guest: bool = False  # an SR-IOV virtual function as a guest sees it (model is guest_model()'s)

    @property
    def card(self) -> str:
        return self.partitions[0].card

    @property
    def render_minor(self) -> int:
        return self.partitions[0].render_minor

    @property
    def gpu_id(self) -> int:
        return self.partitions[0].gpu_id

    @property
    def bus(self) -> int:
        return int(self.bdf[5:7], 16)

    @property
    def location_id(self) -> int:
        """KFD location_id: bus << 8 | device << 3 | function (all our GCDs are device 0, function 0)."""
        return self.bus << 8

    def partition_location_id(self, partition: int) -> int:
        """A partition's KFD location_id: the partition index in bits 28 and up, over the BDF bits."""
        return (partition << 28) | self.location_id

    @property
    def pci_root(self) -> str:
        return f"pci0000:{self.root_bus:02x}"

    @property
    def device_relpath(self) -> str:
        """Path of the PCI device directory relative to the sysfs root."""
        return f"devices/{self.pci_root}/{self.bridge_bdf}/{self.bdf}"


def _digest(*parts: object) -> int:
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def layout(fleet: FleetSpec) -> list[GcdLayout]:
    """Every GCD of the fleet, in PCI BDF order (which is also spec order)."""
    packages = [entry for entry in fleet.entries for _ in range(entry.count)]
    # boards are spread over the four root complexes; both dies of a package stay together
    per_quadrant = -(-len(packages) // len(_ROOT_BUSES))
    # Boards of one model form XGMI hives of up to `hive_boards` boards. A lone board is no hive.
    gcds_by_model: dict[str, list[int]] = {}
    gcd_models = [entry.model for entry in packages for _ in range(entry.model.gcds_per_package)]
    for index, model in enumerate(gcd_models):
        gcds_by_model.setdefault(model.name, []).append(index)
    hive_of: dict[int, tuple[int, ...]] = {}
    for name, members in gcds_by_model.items():
        size = ASICS[name].hive_boards * ASICS[name].gcds_per_package
        for start in range(0, len(members), size):
            hive = tuple(members[start : start + size])
            for gcd in hive:
                hive_of[gcd] = hive
    result: list[GcdLayout] = []
    index = 0
    used_gpu_ids: set[int] = set()
    slots = [0] * len(_ROOT_BUSES)
    minor = 0  # next DRM minor (cards from 0, render nodes from 128)
    xcp_counter = 0  # the driver's system-wide platform device counter
    kfd_node = CPU_SOCKETS

    def unique_gpu_id(*parts: object) -> int:
        gpu_id = 1000 + _digest("gpu_id", *parts) % 64000
        while gpu_id in used_gpu_ids:
            gpu_id += 1
        used_gpu_ids.add(gpu_id)
        return gpu_id

    for package_index, entry in enumerate(packages):
        model = guest_model(entry.model) if entry.guest else entry.model
        board_serial = f"PCB{_digest('serial', model.name, package_index) % 100000:05d}-{package_index + 1:04d}"
        package_id = ""
        quadrant = package_index // per_quadrant
        for die in range(model.gcds_per_package):
            slot = slots[quadrant]
            slots[quadrant] += 1
            root_bus = _ROOT_BUSES[quadrant]
            hive = hive_of[index]
            in_hive = len(hive) > 1
            count = entry.partitions
            xcc_each = model.num_xcc // count
            memory_bytes = model.vram_bytes // MEMORY_PARTITION_COUNTS.get(entry.memory_partition, 1)
            parts, idle = [], []
            # partition 0 is the PCI device; every other DRM node (an idle one too) is a platform device
            for p in range(entry.drm_nodes):
                name = ""
                if p:
                    name = f"amdgpu_xcp{'.' if entry.xcp_names == 'dot' else '_'}{xcp_counter}"
                    xcp_counter += 1
                if p < count:
                    gpu_id = unique_gpu_id(index) if p == 0 else unique_gpu_id(index, "xcp", p)
                    parts.append(
                        PartitionLayout(
                            p, count, minor, 128 + minor, kfd_node, gpu_id, name, p * xcc_each, xcc_each, memory_bytes
                        )
                    )
                    kfd_node += 1
                else:
                    idle.append(PartitionLayout(p, count, minor, 128 + minor, -1, -1, name, 0, 0, 0))
                minor += 1
            unique_id = 0 if entry.guest else _digest("unique_id", model.name, index) | (1 << 62)
            # Without a FRU EEPROM the kernel's serial_number is the die's unique_id as unpadded %llx.
            serial = f"{unique_id:x}" if entry.serial == "unique_id" else board_serial
            if entry.guest:  # a VF reads neither the FRU nor a unique id: no serial, the BDF is its package
                serial = ""
                package_id = f"0000:{root_bus + 1 + 2 * slot:02x}:00.0"
            package_id = package_id or serial
            result.append(
                GcdLayout(
                    index=index,
                    model=model,
                    metrics_version=entry.metrics_version,
                    package_index=package_index,
                    die=die,
                    bdf=f"0000:{root_bus + 1 + 2 * slot:02x}:00.0",
                    bridge_bdf=f"0000:{root_bus:02x}:{1 + slot // 8:02x}.{slot % 8}",
                    root_bus=root_bus,
                    numa_node=quadrant * CPU_SOCKETS // len(_ROOT_BUSES),
                    hwmon_index=CPU_HWMON_COUNT + index,
                    unique_id=unique_id,
                    serial=serial,
                    xgmi_device_id=_digest("xgmi_node", index),
                    hive_id=(_digest("hive", model.name, hive[0]) | 1) if in_hive else 0,
                    xgmi_physical_id=hive.index(index) if in_hive else 0,
                    hive_members=hive,
                    compute_partition=entry.compute_partition,
                    memory_partition=entry.memory_partition,
                    partitions=tuple(parts),
                    xcp_metrics_version=(1, int(entry.xcp_metrics[2])) if entry.xcp_metrics else None,
                    idle_xcp_nodes=tuple(idle),
                    package_id=package_id,
                    guest=entry.guest,
                )
            )
            index += 1
    return result


def guest_model(model: AsicModel) -> AsicModel:
    """The board as an SR-IOV guest sees its virtual function: the VF's PCI device id, the SR-IOV
    VBIOS, no firmware versions (rocm-smi: "Not supported"), and no FRU product name (the driver
    reads no FRU EEPROM on a VF; readers name it from the PCI id)."""
    return replace(
        model,
        device_id=model.vf_device_id,
        subsystem_device=model.vf_device_id,
        vbios=GUEST_VBIOS,
        product_name="",
        product_number="",
        firmware={},
    )


def xgmi_hops(a: GcdLayout, b: GcdLayout, hive_size: int) -> int:
    """XGMI hops between two GCDs of one hive, as the PSP topology table reports them.

    MI250X: the two dies of a package are one hop apart (four in-package links); a die is cabled
    to the same-numbered die of the neighbouring packages in a ring; anything else is two hops.
    MI210 bridges and MI300X baseboards are fully connected: one hop.
    """
    if a.model.gcds_per_package == 1:
        return 1
    if a.package_index == b.package_index:
        return 1
    packages = max(1, hive_size // a.model.gcds_per_package)
    # positions of the two packages around the hive's ring
    pa = a.xgmi_physical_id // a.model.gcds_per_package
    pb = b.xgmi_physical_id // b.model.gcds_per_package
    distance = abs(pa - pb)
    ring_neighbours = distance in (1, packages - 1)
    return 1 if ring_neighbours and a.die == b.die else 2
