"""What a device is, independent of the source that found it: known device ids and package/die pairing.

Devices are keyed by (pci_bus_id, unique_id, partition) (DeviceIdentity.key): card and hwmon numbers
are not stable across boots. Both sources (sysfs, rocm_smi) name products and pair dies through here.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

from exporter.log import get_logger
from exporter.model import DeviceIdentity

log = get_logger("exporter.sources.identity")

# PCI device id -> (asic, product name used when the board has no FRU EEPROM)
KNOWN_DEVICES: dict[str, tuple[str, str]] = {
    "0x740c": ("aldebaran", "AMD Instinct MI250X / MI250"),
    "0x740f": ("aldebaran", "AMD Instinct MI210"),
    "0x7408": ("aldebaran", "AMD Instinct MI250X"),
    "0x74a1": ("aqua_vanjaram", "AMD Instinct MI300X"),
    "0x74a0": ("aqua_vanjaram", "AMD Instinct MI300A"),
    "0x74a5": ("aqua_vanjaram", "AMD Instinct MI325X"),
    "0x74a9": ("aqua_vanjaram", "AMD Instinct MI300X HF"),
    "0x75a0": ("gfx950", "AMD Instinct MI350X"),
    "0x75a3": ("gfx950", "AMD Instinct MI355X"),
    "0x74b5": ("aqua_vanjaram", "AMD Instinct MI300X VF"),
    "0x74b9": ("aqua_vanjaram", "AMD Instinct MI325X VF"),
}
# SR-IOV virtual functions (pci.ids "... VF"): a VM guest's view of a board. The driver's own
# virtualization mode flag is in an ioctl, not in sysfs: the VF's PCI id is what sysfs shows.
VF_DEVICE_IDS = frozenset({"0x74b5", "0x74b9"})
# Dual-die packages: each die is its own PCI function; only die 0 measures package power.
DUAL_DIE_DEVICE_IDS = frozenset({"0x740c", "0x7408"})


def measures_package_power(device: DeviceIdentity) -> bool:
    """False for the second die of a dual-die package: it reads 0 W and 0 J, die 0 measures the package."""
    return not (device.die > 0 and device.device_id in DUAL_DIE_DEVICE_IDS)


def is_secondary_die(device_id: str, power_cap_uw: int | None, power_cap_default_uw: int | None) -> bool:
    """An MI250X's second die, by its own signals: a dual-die device id whose power cap and default are 0.

    rocm-smi prints "N/A (Secondary die)" on the same evidence (with power1_average 0, which a
    discovery-time read cannot tell from an idle die).
    """
    return device_id in DUAL_DIE_DEVICE_IDS and power_cap_uw == 0 and power_cap_default_uw == 0


def assign_packages(devices: list[DeviceIdentity]) -> list[DeviceIdentity]:
    """Pair the dies of dual-die packages (MI250X); every other device is a package of its own.

    A package is identified by its serial and its place together: a serial that more devices carry
    than one package holds (a board vendor's copy-paste, a FRU EEPROM programmed twice) is logged and
    merges nothing: each such package is named `<serial>@<BDF>` of its first die.

    A die known to be secondary (`secondary_die`, from its power cap) is paired with a primary die:
    the nearest in topology of those sharing its serial when the FRU EEPROM gives both the board
    serial; otherwise (no FRU: the kernel falls back to each die's own unique_id for serial_number) the
    one nearest in topology: the lightest XGMI link between them (the in-package links), then the
    deepest shared PCIe ancestor (the package's switch), then the nearest BDF. Without secondary-die
    signals (a source that cannot read the caps) two dual-die devices sharing a serial are numbered in
    BDF order, as before; more than two sharing one are not paired.
    """
    serials = Counter(d.serial for d in devices if d.serial)
    shared: set[str] = set()
    for serial, count in serials.items():
        dies = sum(1 for d in devices if d.serial == serial and d.device_id in DUAL_DIE_DEVICE_IDS)
        if count > (2 if dies == count == 2 else 1):  # the two dies of one package share its serial
            shared.add(serial)
            where = [d.pci_bus_id for d in devices if d.serial == serial]
            log.warning("serial_seen_twice", serial=serial, devices=count, pci_bus_ids=where)

    def own(device: DeviceIdentity) -> str:
        if device.serial and device.serial in shared:
            return f"{device.serial}@{device.pci_bus_id}"
        return _own_package(device)

    dual = [i for i, d in enumerate(devices) if d.device_id in DUAL_DIE_DEVICE_IDS]
    result = [replace(device, package=own(device), die=0) for device in devices]
    if not any(devices[i].secondary_die for i in dual):
        by_serial: dict[str, list[int]] = {}
        for i in dual:
            if devices[i].serial:
                by_serial.setdefault(devices[i].serial, []).append(i)
        for siblings in by_serial.values():
            if len(siblings) == 2 and devices[siblings[0]].serial not in shared:
                for die, i in enumerate(siblings):
                    result[i] = replace(devices[i], package=devices[i].serial, die=die, secondary_die=die > 0)
        return result
    primaries = [i for i in dual if not devices[i].secondary_die]
    taken: set[int] = set()
    for i in (j for j in dual if devices[j].secondary_die):
        device = devices[i]
        free = [p for p in primaries if p not in taken]
        same = [p for p in free if device.serial and devices[p].serial == device.serial]
        candidates = same or free
        partner = min(candidates, key=lambda p: _distance(device, devices[p])) if candidates else None
        if partner is None:
            result[i] = replace(device, package=own(device), die=1)
            continue
        taken.add(partner)
        result[i] = replace(device, package=result[partner].package, die=1)
    return result


def _own_package(device: DeviceIdentity) -> str:
    return device.serial or device.unique_id or device.pci_bus_id


def _distance(secondary: DeviceIdentity, primary: DeviceIdentity) -> tuple[float, int, int, int]:
    xgmi = [
        link.weight
        for link in secondary.topology
        if link.peer_pci_bus_id == primary.pci_bus_id and link.link_type == "xgmi"
    ]
    pairs = zip(secondary.device_dir.split("/"), primary.device_dir.split("/"), strict=False)
    shared = sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))
    # Die 0 is probed first: of two equally near primaries, the one before the secondary die.
    after = 1 if _bdf_number(primary) > _bdf_number(secondary) else 0
    return (min(xgmi) if xgmi else float("inf"), -shared, after, abs(_bdf_number(secondary) - _bdf_number(primary)))


def _bdf_number(device: DeviceIdentity) -> int:
    try:
        domain, bus, rest = device.pci_bus_id.split(":")
        slot, function = rest.split(".")
        return (int(domain, 16) << 16) | (int(bus, 16) << 8) | (int(slot, 16) << 3) | int(function, 16)
    except ValueError:
        return 0
