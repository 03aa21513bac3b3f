"""Fleet specs ("4xMI250X", "1xMI210,2xMI250X") and the physical layout they imply.

The layout gives every GCD its identity: PCI address, card/hwmon/KFD numbers, serials, hive.
It depends only on the spec (not on the seed), so a fleet always looks the same.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from exporter.simulator.asics import ASICS, AsicModel

MAX_GCDS = 128
CPU_SOCKETS = 2
CPU_HWMON_COUNT = CPU_SOCKETS  # one k10temp per socket, numbered before the GPUs' hwmons
_ROOT_BUSES = (0x00, 0x40, 0x80, 0xC0)  # one PCI root complex per EPYC quadrant
_HIVE_BOARDS = {"MI210": 4, "MI250X": 4, "MI300X": 8}
_TERM = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9]+)\s*(?::\s*(.*))?$")


@dataclass(frozen=True, slots=True)
class FleetEntry:
    count: int  # packages (boards)
    model: AsicModel
    metrics_version: tuple[int, int]

    def __str__(self) -> str:
        text = f"{self.count}x{self.model.name}"
        if self.metrics_version != self.model.metrics_version:
            text += f":gpu_metrics={self.metrics_version[0]}.{self.metrics_version[1]}"
        return text


@dataclass(frozen=True, slots=True)
class FleetSpec:
    entries: tuple[FleetEntry, ...]

    @property
    def gcd_count(self) -> int:
        return sum(e.count * e.model.gcds_per_package for e in self.entries)

    def __str__(self) -> str:
        return ",".join(str(e) for e in self.entries)


def parse_fleet(spec: str) -> FleetSpec:
    """Parse "4xMI250X", "MI210", "1xMI210,2xMI250X", "MI300X:gpu_metrics=1.6"; ValueError if bad."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("empty fleet spec: expected e.g. '4xMI250X' or '1xMI210,2xMI250X'")
    entries = [_parse_term(term, spec) for term in spec.split(",")]
    fleet = FleetSpec(tuple(entries))
    if fleet.gcd_count > MAX_GCDS:
        raise ValueError(f"fleet spec {spec!r} has {fleet.gcd_count} GCDs; at most {MAX_GCDS} are supported")
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
    for option in (options or "").split(";") if options else ():
        key, sep, value = option.partition("=")
        if key.strip() != "gpu_metrics" or not sep:
            raise ValueError(f"unknown option {option.strip()!r} for {model.name}: only gpu_metrics=1.N")
        version = _parse_metrics_version(value.strip(), model)
    return FleetEntry(count, model, version)


def _parse_metrics_version(text: str, model: AsicModel) -> tuple[int, int]:
    allowed = ", ".join(f"{a}.{b}" for a, b in model.metrics_versions)
    fmt, _, content = text.partition(".")
    if not (fmt.isdecimal() and content.isdecimal()):
        raise ValueError(f"bad gpu_metrics version {text!r} for {model.name}: expected one of {allowed}")
    version = (int(fmt), int(content))
    if version not in model.metrics_versions:
        raise ValueError(f"{model.name} does not emit gpu_metrics {text}: expected one of {allowed}")
    return version


@dataclass(frozen=True, slots=True)
class GcdLayout:
    """Where and what one GCD is. `index` is its position in PCI BDF order (= card number)."""

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
    kfd_node: int
    gpu_id: int
    unique_id: int
    serial: str
    xgmi_device_id: int
    hive_id: int  # 0 when not part of a multi-device hive
    xgmi_physical_id: int
    hive_members: tuple[int, ...]  # GCD indices in the same hive (including this one)

    @property
    def card(self) -> str:
        return f"card{self.index}"

    @property
    def render_minor(self) -> int:
        return 128 + self.index

    @property
    def bus(self) -> int:
        return int(self.bdf[5:7], 16)

    @property
    def location_id(self) -> int:
        """KFD location_id: bus << 8 | device << 3 | function (all our GCDs are device 0, function 0)."""
        return self.bus << 8

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
    packages: list[tuple[AsicModel, tuple[int, int]]] = []
    for entry in fleet.entries:
        packages.extend((entry.model, entry.metrics_version) for _ in range(entry.count))
    # boards are spread over the four root complexes; both dies of a package stay together
    per_quadrant = -(-len(packages) // len(_ROOT_BUSES))
    # Boards of one model form XGMI hives: an MI210 Infinity Fabric bridge joins up to 4 cards, a
    # node board cables up to 4 MI250X packages, a baseboard carries 8 MI300X. A lone board is no hive.
    gcds_by_model: dict[str, list[int]] = {}
    index = 0
    for model, _version in packages:
        for _die in range(model.gcds_per_package):
            gcds_by_model.setdefault(model.name, []).append(index)
            index += 1
    hive_of: dict[int, tuple[int, ...]] = {}
    for name, members in gcds_by_model.items():
        size = _HIVE_BOARDS[name] * ASICS[name].gcds_per_package
        for start in range(0, len(members), size):
            hive = tuple(members[start : start + size])
            for gcd in hive:
                hive_of[gcd] = hive
    result: list[GcdLayout] = []
    index = 0
    used_gpu_ids: set[int] = set()
    slots = [0] * len(_ROOT_BUSES)
    for package_index, (model, version) in enumerate(packages):
        serial = f"PCB{_digest('serial', model.name, package_index) % 100000:05d}-{package_index + 1:04d}"
        quadrant = package_index // per_quadrant
        for die in range(model.gcds_per_package):
            slot = slots[quadrant]
            slots[quadrant] += 1
            root_bus = _ROOT_BUSES[quadrant]
            bus = root_bus + 1 + 2 * slot
            bdf = f"0000:{bus:02x}:00.0"
            bridge = f"0000:{root_bus:02x}:{1 + slot // 8:02x}.{slot % 8}"
            hive = hive_of[index]
            in_hive = len(hive) > 1
            gpu_id = 1000 + _digest("gpu_id", index) % 64000
            while gpu_id in used_gpu_ids:
                gpu_id += 1
            used_gpu_ids.add(gpu_id)
            result.append(
                GcdLayout(
                    index=index,
                    model=model,
                    metrics_version=version,
                    package_index=package_index,
                    die=die,
                    bdf=bdf,
                    bridge_bdf=bridge,
                    root_bus=root_bus,
                    numa_node=quadrant * CPU_SOCKETS // len(_ROOT_BUSES),
                    hwmon_index=CPU_HWMON_COUNT + index,
                    kfd_node=CPU_SOCKETS + index,
                    gpu_id=gpu_id,
                    unique_id=_digest("unique_id", model.name, index) | (1 << 62),
                    serial=serial,
                    xgmi_device_id=_digest("xgmi_node", index),
                    hive_id=(_digest("hive", model.name, hive[0]) | 1) if in_hive else 0,
                    xgmi_physical_id=hive.index(index) if in_hive else 0,
                    hive_members=hive,
                )
            )
            index += 1
    return result


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
