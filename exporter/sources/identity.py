"""What a device is, independent of the source that found it: known device ids and package/die pairing.

Devices are keyed by (pci_bus_id, unique_id, partition) (DeviceIdentity.key): card and hwmon numbers
are not stable across boots. Both sources (sysfs, rocm_smi) name products and pair dies through here.
"""

from __future__ import annotations

from dataclasses import replace

from exporter.model import DeviceIdentity

# PCI device id -> (asic, product name used when the board has no FRU EEPROM)
KNOWN_DEVICES: dict[str, tuple[str, str]] = {
    "0x740c": ("aldebaran", "AMD Instinct MI250X / MI250"),
    "0x740f": ("aldebaran", "AMD Instinct MI210"),
    "0x7408": ("aldebaran", "AMD Instinct MI250X"),
    "0x74a1": ("aqua_vanjaram", "AMD Instinct MI300X"),
    "0x74a0": ("aqua_vanjaram", "AMD Instinct MI300A"),
    "0x74a5": ("aqua_vanjaram", "AMD Instinct MI325X"),
    "0x74a9": ("aqua_vanjaram", "AMD Instinct MI300X HF"),
}
# Dual-die packages: each die is its own PCI function; only die 0 measures package power.
DUAL_DIE_DEVICE_IDS = frozenset({"0x740c", "0x7408"})


def measures_package_power(device: DeviceIdentity) -> bool:
    """False for the second die of a dual-die package: it reads 0 W and 0 J, die 0 measures the package."""
    return not (device.die > 0 and device.device_id in DUAL_DIE_DEVICE_IDS)


def assign_packages(devices: list[DeviceIdentity]) -> list[DeviceIdentity]:
    """Group the dies of dual-die packages (MI250X) by their shared serial; die index in BDF order."""
    by_serial: dict[str, list[int]] = {}
    for index, device in enumerate(devices):
        if device.device_id in DUAL_DIE_DEVICE_IDS and device.serial:
            by_serial.setdefault(device.serial, []).append(index)
    result = list(devices)
    for index, device in enumerate(devices):
        siblings = by_serial.get(device.serial) if device.device_id in DUAL_DIE_DEVICE_IDS else None
        if siblings and len(siblings) > 1:
            result[index] = replace(device, package=device.serial, die=siblings.index(index))
        else:
            result[index] = replace(device, package=device.serial or device.unique_id or device.pci_bus_id, die=0)
    return result
