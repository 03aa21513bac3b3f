"""Finding amdgpu devices under a sysfs root and reading what they are (DeviceIdentity).

Runs at start and on the slow rediscovery schedule, never per cycle.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from exporter.model import DeviceIdentity, TopologyLink, frozen_map
from exporter.sources import textfiles as tf
from exporter.sources.errors import record
from exporter.sources.identity import DUAL_DIE_DEVICE_IDS, KNOWN_DEVICES, assign_packages, is_secondary_die
from exporter.sources.labels import clean_label, clean_name
from exporter.sources.sysfs.files import listdir, read_file_bytes, read_parsed

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_CARD = re.compile(r"^card(\d+)$")
_KFD_LINK_TYPES = {2: "pcie", 11: "xgmi"}


@dataclass(frozen=True, slots=True)
class Card:
    """A DRM card found by listing class/drm (no attribute file read yet: listing never blocks)."""

    name: str  # "card3"
    device_dir: str
    bdf: str


def list_cards(root: str) -> list[Card]:
    """Every PCI DRM card under root/class/drm, by card name; MI300 partition platform devices skipped."""
    drm = os.path.join(root, "class", "drm")
    cards = []
    for name in listdir(drm):
        if not _CARD.match(name):
            continue
        device_dir = os.path.realpath(os.path.join(drm, name, "device"))
        bdf = _bdf_from_path(device_dir)
        if bdf is None:  # MI300 partition platform devices (amdgpu_xcp_N) and other non-PCI cards
            continue
        cards.append(Card(name, device_dir, bdf))
    return sorted(cards, key=lambda c: int(c.name[4:]))


def read_driver_version(root: str) -> str:
    return read_parsed(os.path.join(root, "module", "amdgpu", "version"), tf.parse_word) or ""


def identify(card: Card, driver_version: str, kfd: dict[str, tuple[TopologyLink, ...]]) -> DeviceIdentity | None:
    """The card's identity, or None when it is not an amdgpu device (vendor 0x1002, DRIVER=amdgpu)."""
    uevent = read_parsed(os.path.join(card.device_dir, "uevent"), tf.parse_uevent) or {}
    vendor = read_parsed(os.path.join(card.device_dir, "vendor"), tf.parse_hex_id)
    if uevent.get("DRIVER") != "amdgpu" or vendor != "0x1002":
        return None
    return read_identity(card.name, card.device_dir, card.bdf, driver_version, kfd)


def discover_devices(root: str) -> list[DeviceIdentity]:
    """Every PCI card under root/class/drm driven by amdgpu (vendor 0x1002), in PCI order (no deadlines)."""
    kfd = read_kfd_topology(root)
    driver_version = read_driver_version(root)
    found = [d for card in list_cards(root) if (d := identify(card, driver_version, kfd)) is not None]
    return assign_packages(sorted(found, key=lambda d: d.pci_bus_id))


def _bdf_from_path(path: str) -> str | None:
    name = os.path.basename(path.rstrip("/")).lower()
    return name if _BDF.match(name) else None


def read_identity(
    card: str,
    device_dir: str,
    bdf: str,
    driver_version: str,
    kfd: dict[str, tuple[TopologyLink, ...]],
) -> DeviceIdentity:
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
        card=card,
        device_dir=device_dir,
        unique_id=read_parsed(os.path.join(device_dir, "unique_id"), tf.parse_unique_id) or "",
        secondary_die=is_secondary_die(device_id, cap, cap_default),
        hwmon_dir=hwmon_dir,
        vendor_id="0x1002",
        device_id=device_id,
        product=text("product_name") or default_product,
        asic=asic,
        serial=text("serial_number"),
        vbios=text("vbios_version"),
        driver_version=driver_version,
        compute_partition=text("current_compute_partition"),
        memory_partition=text("current_memory_partition"),
        xgmi_hive_id=text("xgmi_hive_info/xgmi_hive_id"),
        xgmi_physical_id=physical,
        numa_node=numa if numa is not None and numa >= 0 else None,
        firmware=frozen_map(firmware),
        topology=kfd.get(bdf, ()),
        gpu_metrics_version=metrics_version,
    )


def read_kfd_topology(root: str) -> dict[str, tuple[TopologyLink, ...]]:
    """BDF -> io_links from the KFD topology (peer BDFs resolved through node numbers)."""
    nodes_dir = os.path.join(root, "class", "kfd", "kfd", "topology", "nodes")
    node_bdf: dict[int, str] = {}
    node_links: dict[int, list[dict[str, int]]] = {}
    for entry in listdir(nodes_dir):
        if not entry.isdigit():
            continue
        node = int(entry)
        node_dir = os.path.join(nodes_dir, entry)
        props = read_parsed(os.path.join(node_dir, "properties"), tf.parse_key_values) or {}
        gpu_id = read_parsed(os.path.join(node_dir, "gpu_id"), tf.parse_unsigned) or 0
        if gpu_id and "location_id" in props:
            loc = props["location_id"]
            node_bdf[node] = f"{props.get('domain', 0):04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 0x7}"
        links_dir = os.path.join(node_dir, "io_links")
        node_links[node] = [
            link
            for link_entry in listdir(links_dir)
            if (link := read_parsed(os.path.join(links_dir, link_entry, "properties"), tf.parse_key_values))
        ]
    result: dict[str, tuple[TopologyLink, ...]] = {}
    for node, bdf in node_bdf.items():
        links = []
        for props in node_links.get(node, []):
            peer = node_bdf.get(props.get("node_to", -1), "")
            kind = _KFD_LINK_TYPES.get(props.get("type", -1), f"type{props.get('type', -1)}")
            # Each KFD io_link is a direct link: one hop.
            links.append(TopologyLink(peer, kind, 1, props.get("weight", 0)))
        result[bdf] = tuple(sorted(links, key=lambda link: (link.peer_pci_bus_id, link.link_type)))
    return result
