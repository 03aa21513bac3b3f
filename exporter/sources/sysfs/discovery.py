"""Finding amdgpu devices under a sysfs root and reading what they are (DeviceIdentity).

Runs at start and on the slow rediscovery schedule, never per cycle.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from exporter.model import DeviceIdentity, TopologyLink, frozen_map
from exporter.sources import textfiles as tf
from exporter.sources.errors import record
from exporter.sources.identity import (
    DUAL_DIE_DEVICE_IDS,
    KNOWN_DEVICES,
    VF_DEVICE_IDS,
    assign_packages,
    is_secondary_die,
)
from exporter.sources.labels import clean_label, clean_name
from exporter.sources.sysfs.files import listdir, read_file_bytes, read_parsed

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")
# Partition platform devices: amdgpu_xcp_<n> (ROCm DKMS drivers) or amdgpu_xcp.<n> (some kernels).
_XCP_DEVICE = re.compile(r"^amdgpu_xcp[._]\d+$")
_PARTITION_SHIFT = 28  # KFD location_id: partition << 28 | bus << 8 | device << 3 | function
_KFD_LINK_TYPES = {2: "pcie", 11: "xgmi"}


@dataclass(frozen=True, slots=True)
class Card:
    """A PCI DRM card found by listing class/drm (no attribute file read yet: listing never blocks)."""

    name: str  # "card3"
    device_dir: str
    bdf: str


@dataclass(frozen=True, slots=True)
class Listing:
    """What listing class/drm and reading the KFD topology found, before any card's identity is read."""

    cards: tuple[Card, ...]  # PCI cards in card order
    partitions: tuple[tuple[str, int, str, str], ...]  # (socket BDF, partition, card, platform device dir)
    topology: Mapping[tuple[str, int], tuple[TopologyLink, ...]]
    driver_version: str


def list_devices(root: str) -> Listing:
    """The cards under root/class/drm and the KFD topology; reads no SMU-backed file.

    A PCI card is one device, or partition 0 of a partitioned MI300-class socket. Partitions 1..N-1
    of such a socket are platform devices (amdgpu_xcp_<n> or amdgpu_xcp.<n>) holding only DRM
    minors: their KFD node, found by render minor, says which socket (location_id's BDF bits) and
    which partition (location_id >> 28) they are. An xcp node without a KFD node is allocated but
    unused in the current mode, and is not a device.
    """
    drm = os.path.join(root, "class", "drm")
    try:
        names = os.listdir(drm)
    except OSError:
        return Listing((), (), {}, "")
    kfd = read_kfd_nodes(root)
    by_render_minor = {node.render_minor: node for node in kfd.values() if node.render_minor}
    driver_version = read_parsed(os.path.join(root, "module", "amdgpu", "version"), tf.parse_word) or ""
    cards: list[Card] = []
    partitions: list[tuple[str, int, str, str]] = []
    for name in names:
        if not _CARD.match(name):
            continue
        device_dir = os.path.realpath(os.path.join(drm, name, "device"))
        bdf = os.path.basename(device_dir).lower()
        if not _BDF.match(bdf):  # not a PCI device: perhaps a partition's platform device
            if _XCP_DEVICE.match(os.path.basename(device_dir)):
                node = _partition_node(device_dir, by_render_minor)
                if node is not None and node.partition > 0:
                    partitions.append((node.pci_bus_id, node.partition, name, device_dir))
            continue
        cards.append(Card(name, device_dir, bdf))
    cards.sort(key=lambda c: int(c.name[4:]))
    return Listing(tuple(cards), tuple(partitions), kfd_topology(kfd), driver_version)


def identify(card: Card, listing: Listing) -> DeviceIdentity | None:
    """The card's identity, or None when it is not an amdgpu device (vendor 0x1002, DRIVER=amdgpu)."""
    uevent = read_parsed(os.path.join(card.device_dir, "uevent"), tf.parse_uevent) or {}
    vendor = read_parsed(os.path.join(card.device_dir, "vendor"), tf.parse_hex_id)
    if uevent.get("DRIVER") != "amdgpu" or vendor != "0x1002":
        return None
    device_dir, bdf = card.device_dir, card.bdf

    def text(name: str) -> str:
        path = os.path.join(device_dir, name)
        cleaned, changed = clean_label(read_parsed(path, str) or "")
        if changed:
            record(path, "label", "cut to length or cleaned of control characters")
        return cleaned

    device_id = read_parsed(os.path.join(device_dir, "device"), tf.parse_hex_id) or ""
    asic, default_product = KNOWN_DEVICES.get(device_id, ("", ""))
    firmware: dict[str, str] = {}
    fw_dir = os.path.join(device_dir, "fw_version")
    for entry in listdir(fw_dir):
        if entry.endswith("_fw_version"):
            version = read_parsed(os.path.join(fw_dir, entry), tf.parse_fw_version)
            if version is not None:
                firmware[clean_name(entry.removesuffix("_fw_version"))] = version
    hwmon_dir = ""
    for entry in sorted(listdir(os.path.join(device_dir, "hwmon"))):
        candidate = os.path.join(device_dir, "hwmon", entry)
        if read_parsed(os.path.join(candidate, "name"), str.strip) == "amdgpu":
            hwmon_dir = os.path.realpath(candidate)
            break
    cap = cap_default = None
    if hwmon_dir and device_id in DUAL_DIE_DEVICE_IDS:
        cap = read_parsed(os.path.join(hwmon_dir, "power1_cap"), tf.parse_unsigned)
        cap_default = read_parsed(os.path.join(hwmon_dir, "power1_cap_default"), tf.parse_unsigned)
    blob = read_file_bytes(os.path.join(device_dir, "gpu_metrics"))
    metrics_version = f"{blob[2]}.{blob[3]}" if blob is not None and len(blob) >= 4 else ""
    numa = read_parsed(os.path.join(device_dir, "numa_node"), tf.parse_signed)
    physical = read_parsed(os.path.join(device_dir, "xgmi_physical_id"), tf.parse_unsigned)
    return DeviceIdentity(
        pci_bus_id=bdf,
        card=card.name,
        device_dir=device_dir,
        unique_id=read_parsed(os.path.join(device_dir, "unique_id"), tf.parse_unique_id) or "",
        secondary_die=is_secondary_die(device_id, cap, cap_default),
        hwmon_dir=hwmon_dir,
        vendor_id="0x1002",
        device_id=device_id,
        product=text("product_name") or default_product,
        product_number=text("product_number"),
        asic=asic,
        serial=text("serial_number"),
        vbios=text("vbios_version"),
        driver_version=listing.driver_version,
        compute_partition=text("current_compute_partition"),
        memory_partition=text("current_memory_partition"),
        xgmi_hive_id=text("xgmi_hive_info/xgmi_hive_id"),
        xgmi_physical_id=physical,
        numa_node=numa if numa is not None and numa >= 0 else None,
        firmware=frozen_map(firmware),
        topology=listing.topology.get((bdf, 0), ()),
        gpu_metrics_version=metrics_version,
        deployment="guest" if device_id in VF_DEVICE_IDS else "baremetal",
    )


def assemble(sockets: list[DeviceIdentity], listing: Listing) -> list[DeviceIdentity]:
    """Sockets paired into packages, plus their partitions: socket by socket in BDF order, partitions by index."""
    found = assign_packages(sorted(sockets, key=lambda d: d.pci_bus_id))
    socket_by_bdf = {device.pci_bus_id: device for device in found}
    for bdf, index, card, device_dir in listing.partitions:
        socket = socket_by_bdf.get(bdf)
        if socket is None:  # its socket's PCI device is not an amdgpu card (or vanished, or not read in time)
            continue
        topology = listing.topology.get((bdf, index), ())
        found.append(
            replace(socket, card=card, device_dir=device_dir, hwmon_dir="", partition=index, topology=topology)
        )
    return sorted(found, key=lambda d: (d.pci_bus_id, d.partition))


def _partition_node(device_dir: str, by_render_minor: dict[int, KfdNode]) -> KfdNode | None:
    """The KFD node of a partition's platform device, through the render minor both carry."""
    for entry in listdir(os.path.join(device_dir, "drm")):
        match = _RENDER.match(entry)
        if match:
            return by_render_minor.get(int(match.group(1)))
    return None


@dataclass(frozen=True, slots=True)
class KfdNode:
    """One GPU node of the KFD topology (one per compute partition on a partitioned socket)."""

    node: int
    pci_bus_id: str
    partition: int
    render_minor: int
    links: tuple[Mapping[str, int], ...]
    num_xcc: int = 0  # the XCCs of its partition
    directory: str = ""


def read_kfd_nodes(root: str) -> dict[int, KfdNode]:
    """KFD node number -> GPU node (CPU nodes, gpu_id 0, are left out)."""
    nodes_dir = os.path.join(root, "class", "kfd", "kfd", "topology", "nodes")
    nodes: dict[int, KfdNode] = {}
    for entry in listdir(nodes_dir):
        if not entry.isdigit():
            continue
        node_dir = os.path.join(nodes_dir, entry)
        props = read_parsed(os.path.join(node_dir, "properties"), tf.parse_key_values) or {}
        gpu_id = read_parsed(os.path.join(node_dir, "gpu_id"), tf.parse_unsigned) or 0
        if not gpu_id or "location_id" not in props:
            continue
        links_dir = os.path.join(node_dir, "io_links")
        links = tuple(
            link
            for link_entry in sorted(listdir(links_dir), key=lambda e: (len(e), e))
            if (link := read_parsed(os.path.join(links_dir, link_entry, "properties"), tf.parse_key_values))
        )
        loc = props["location_id"]
        bdf = f"{props.get('domain', 0):04x}:{(loc >> 8) & 0xFF:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 0x7}"
        partition, render_minor = loc >> _PARTITION_SHIFT, props.get("drm_render_minor", 0)
        nodes[int(entry)] = KfdNode(int(entry), bdf, partition, render_minor, links, props.get("num_xcc", 0), node_dir)
    return nodes


def kfd_topology(nodes: Mapping[int, KfdNode]) -> dict[tuple[str, int], tuple[TopologyLink, ...]]:
    """(BDF, partition) -> its io_links, peers resolved through node numbers ("" for a CPU node)."""
    result: dict[tuple[str, int], tuple[TopologyLink, ...]] = {}
    for node in nodes.values():
        links = []
        for props in node.links:
            peer = nodes.get(props.get("node_to", -1))
            peer_bdf, peer_partition = (peer.pci_bus_id, peer.partition) if peer else ("", 0)
            kind = _KFD_LINK_TYPES.get(props.get("type", -1), f"type{props.get('type', -1)}")
            # Each KFD io_link is a direct link: one hop.
            links.append(TopologyLink(peer_bdf, kind, 1, props.get("weight", 0), peer_partition=peer_partition))
        links.sort(key=lambda link: (link.peer_pci_bus_id, link.link_type, link.peer_partition))
        result[(node.pci_bus_id, node.partition)] = tuple(links)
    return result
