"""`amdgpu-exporter doctor [--json]`: the version matrix and the checks an operator does by hand
before blaming the code (kernel, driver, ROCm, SMI libraries, firmware, PCIe links, the runtime's
environment variables, device permissions). Each finding is ok, warn or fail with one line of
advice; the exit status is 1 when anything failed.

Facts are gathered at the edges (sources/host.py, collect_devices, collect_access); judge() is pure.
Every read is relative to --path.sysfs / --path.procfs / --path.dev / --path.rocm, and every
device read runs against the read deadline, so a hung GPU is reported, not waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import glob
import grp
import json
import os
import pwd
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any, TextIO

from exporter.alerting.rulefile import rule_file_of
from exporter.alerting.verdict import CheckThresholds, HealthThresholds, drain_command, evaluate_health, taint_command
from exporter.config import ConfigError, Settings, node_name
from exporter.model import DeviceIdentity, GpuHealth, frozen_map
from exporter.sources import textfiles as tf
from exporter.sources.host import HostFacts, LibraryVersion, collect, parse_kernel_release
from exporter.threads import run_once

OK, WARN, FAIL = "ok", "warn", "fail"

# The oldest kernel whose amdgpu drives the part (PCI device id -> (major, minor)).
MIN_KERNEL = {"0x740f": (5, 15)}  # MI210
# The linux default of amdgpu.ppfeaturemask: everything but overdrive (0x4000) and GFX DCS (0x80000).
DEFAULT_PPFEATUREMASK = 0xFFF7BFFF
PP_FEATURES = {0x1: "sclk DPM", 0x2: "mclk DPM", 0x4: "PCIe DPM", 0x10: "power containment", 0x8000: "GFXOFF"}
PP_OVERDRIVE = 0x4000
# The ISA each Instinct ASIC really is, as HSA_OVERRIDE_GFX_VERSION spells it.
NATIVE_GFX = {"aldebaran": ("gfx90a", "9.0.10"), "aqua_vanjaram": ("gfx942", "9.4.2")}


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: str  # ok | warn | fail
    value: str  # what was found, for the version matrix
    advice: str = ""  # one line; always given for warn and fail
    gpu: int | None = None
    pci_bus_id: str = ""
    partition: str = ""  # "CPX 3" for a compute partition of a socket, "" otherwise


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    gpu: int
    identity: DeviceIdentity
    up: bool
    down_reason: str
    link_speed: float | None = None  # transfers per second
    link_max_speed: float | None = None
    link_width: int | None = None
    link_max_width: int | None = None
    render_node: str = ""  # "renderD128"
    health: GpuHealth | None = None  # the health verdict on this read (None: not judged)


@dataclass(frozen=True, slots=True)
class AccessFacts:
    is_root: bool
    user: str
    groups: tuple[str, ...]
    nodes: Mapping[str, str] = field(default_factory=dict)  # /dev path -> "ok" | "missing" | "denied"


@dataclass(frozen=True, slots=True)
class DebugfsFacts:
    """What this user can read of debugfs (<sysfs>/kernel/debug): the CPER rings and the driver's
    exact bad-page thresholds live there, nowhere else."""

    path: str
    state: str  # ok | not_mounted | denied | error: <why>
    user: str = ""
    is_root: bool = False
    # per device (gpu -> file -> ok | missing | denied | locked_down | error), for devices found
    files: Mapping[int, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Facts:
    host: HostFacts
    devices: tuple[DeviceFacts, ...] = ()
    discovery_error: str = ""
    read_timeout: float = 2.0
    dev: str = "/dev"
    access: AccessFacts = AccessFacts(is_root=False, user="", groups=())
    node: str = ""  # what the drain and taint commands name (--node-name, else the host name)
    debugfs: DebugfsFacts | None = None


# -- gathering (I/O) --------------------------------------------------------------------------


def _link(device_dir: str) -> dict[str, Any]:
    def read(name: str, parse: Any) -> Any:
        try:
            with open(os.path.join(device_dir, name), encoding="ascii") as handle:
                return parse(handle.read())
        except (OSError, UnicodeDecodeError, tf.TextParseError):
            return None

    return {
        "link_speed": read("current_link_speed", tf.parse_link_speed),
        "link_max_speed": read("max_link_speed", tf.parse_link_speed),
        "link_width": read("current_link_width", tf.parse_link_width),
        "link_max_width": read("max_link_width", tf.parse_link_width),
        "render_node": next(iter(sorted(os.path.basename(p) for p in glob.glob(f"{device_dir}/drm/renderD*"))), ""),
    }


def collect_devices(settings: Settings, sysfs: str) -> tuple[tuple[DeviceFacts, ...], str]:
    """Discovery and one read of every device, each against the deadline; (devices, error)."""
    from exporter.pipeline.poller import Poller
    from exporter.sources.sysfs import SysfsSource

    source = SysfsSource(sysfs, slow_interval=settings.slow_interval)
    poller = Poller(source, interval=settings.interval, read_timeout=settings.read_timeout, source_name="sysfs")
    try:
        try:
            found = run_once(poller.discover, "discovery").result(timeout=poller.discovery_deadline)
        except TimeoutError:  # its daemon thread is abandoned: a hung read never holds up the exit
            return (), f"device discovery did not finish within {poller.discovery_deadline:g} s"
        if not found:
            return (), ""
        out = []
        snapshot = asyncio.run(poller.poll_once())
        verdict = evaluate_health(None, snapshot, _one_read(rule_file_of(settings).health), node_name(settings))
        health = {gpu.gpu: gpu for gpu in verdict.gpus}
        for state in snapshot.devices:
            try:
                link = run_once(partial(_link, state.identity.device_dir), "link").result(timeout=settings.read_timeout)
            except TimeoutError:
                link = {}
            out.append(
                DeviceFacts(
                    state.gpu, state.identity, state.up, state.down_reason, **link, health=health.get(state.gpu)
                )
            )
        return tuple(out), ""
    finally:
        poller.close()


def _one_read(thresholds: HealthThresholds) -> HealthThresholds:
    """The daemon's thresholds with every `for` at 0: one read cannot see how long a condition has
    held, so doctor reports one that holds now (a counter's growth needs the daemon's history)."""

    def now(values: CheckThresholds) -> CheckThresholds:
        return replace(values, for_seconds=0.0)

    return replace(
        thresholds,
        checks=frozen_map({k: now(v) for k, v in thresholds.checks.items()}),
        asic_overrides=frozen_map({k: now(v) for k, v in thresholds.asic_overrides.items()}),
    )


def collect_access(dev: str, devices: Sequence[DeviceFacts]) -> AccessFacts:
    def state(path: str) -> str:
        if not os.path.exists(path):
            return "missing"
        return "ok" if os.access(path, os.R_OK | os.W_OK) else "denied"

    renders = [os.path.join(dev, "dri", device.render_node) for device in devices if device.render_node]
    nodes = {path: state(path) for path in [os.path.join(dev, "kfd"), *renders]}
    names = []
    for gid in sorted(set(os.getgroups()) | {os.getegid()}):
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.append(str(gid))
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        user = str(os.geteuid())
    return AccessFacts(is_root=os.geteuid() == 0, user=user, groups=tuple(names), nodes=nodes)


DEBUGFS_FILES = ("ras/bad_page_cnt_threshold", "amdgpu_ring_cper")


def _file_state(path: str) -> str:
    try:
        with open(path, "rb", buffering=0) as handle:
            handle.read(1)
    except FileNotFoundError:
        return "missing"
    except PermissionError as error:
        # EPERM from debugfs itself is the kernel's lockdown; EACCES is the file's mode
        return "locked_down" if error.errno == errno.EPERM else "denied"
    except OSError as error:
        return f"error: {error.strerror}"
    return "ok"


def collect_debugfs(sysfs: str, devices: Sequence[DeviceFacts], access: AccessFacts, deadline: float) -> DebugfsFacts:
    """Whether this user can read the debugfs files the health checks need (each open against the deadline)."""
    top = os.path.join(sysfs, "kernel", "debug")
    try:
        mounted = bool(os.listdir(top))  # an empty folder: debugfs is not mounted on it
    except FileNotFoundError:
        mounted = False
    except PermissionError:
        return DebugfsFacts(top, "denied", access.user, access.is_root)
    except OSError as error:
        return DebugfsFacts(top, f"error: {error.strerror}", access.user, access.is_root)
    if not mounted:
        return DebugfsFacts(top, "not_mounted", access.user, access.is_root)
    files: dict[int, dict[str, str]] = {}
    for device in devices:
        minor = device.identity.card.removeprefix("card")
        if not minor.isdigit() or device.identity.partition:  # a partition's files are its socket's
            continue
        folder = os.path.join(top, "dri", minor)
        found = {}
        for name in DEBUGFS_FILES:
            try:
                found[name] = run_once(partial(_file_state, os.path.join(folder, name)), "debugfs").result(deadline)
            except TimeoutError:
                found[name] = "error: no answer within the read deadline"
        files[device.gpu] = found
    return DebugfsFacts(top, "ok", access.user, access.is_root, files)


# -- judging (pure) ---------------------------------------------------------------------------


def judge(facts: Facts) -> list[Finding]:
    host = facts.host
    return [
        *_kernel(host, facts.devices),
        *_driver(host),
        *_rocm(host),
        *map(_library, host.libraries),
        *_devices(facts),
        *_environment(host, facts.devices),
        *_access(facts.access),
        *_debugfs(facts.debugfs),
    ]


def _kernel(host: HostFacts, devices: Sequence[DeviceFacts]) -> list[Finding]:
    release = host.kernel_release or ""
    version = parse_kernel_release(release)
    if version is None:
        return [Finding("kernel", WARN, release or "unknown", "cannot read /proc/sys/kernel/osrelease; run uname -r")]
    for device in devices:
        needed = MIN_KERNEL.get(device.identity.device_id)
        if needed and version < needed:
            part = device.identity.product or device.identity.device_id
            need = ".".join(map(str, needed))
            advice = f"{part} needs Linux {need} or later; upgrade the kernel (or install the amdgpu-dkms driver)"
            return [Finding("kernel", FAIL, release, advice)]
    return [Finding("kernel", OK, release)]


def _driver(host: HostFacts) -> list[Finding]:
    if not host.driver_loaded:
        return [Finding("amdgpu driver", FAIL, "not loaded", "load it: modprobe amdgpu (and see dmesg for why not)")]
    version = host.driver_version or f"in-tree (kernel {host.kernel_release or '?'})"
    state = host.driver_initstate
    value = f"{version}, initstate {'?' if state is None else state}"
    if state in (None, "live"):
        driver = Finding("amdgpu driver", OK, value)
    else:
        driver = Finding("amdgpu driver", FAIL, value, "the module did not finish loading; see dmesg | grep amdgpu")
    return [driver, _ppfeaturemask(host.ppfeaturemask)]


def _ppfeaturemask(mask: int | None) -> Finding:
    if mask is None:
        advice = "cannot read /sys/module/amdgpu/parameters/ppfeaturemask; check amdgpu.ppfeaturemask in /proc/cmdline"
        return Finding("ppfeaturemask", WARN, "unreadable", advice)
    if mask == DEFAULT_PPFEATUREMASK:
        return Finding("ppfeaturemask", OK, f"0x{mask:08x} (the default)")
    off = [name for bit, name in PP_FEATURES.items() if not mask & bit]
    notes = ["overdrive unlocked (clocks and voltages can be changed from sysfs)"] if mask & PP_OVERDRIVE else []
    notes += ["disabled: " + ", ".join(off)] if off else []
    value = f"0x{mask:08x}; " + "; ".join(notes or ["non-default"])
    if not off:
        return Finding("ppfeaturemask", OK, value, "differs from the default 0xfff7bfff; fine when intended")
    advice = (
        "power management features are off: clocks or the power cap may not behave; "
        "remove amdgpu.ppfeaturemask from the kernel command line unless this is intended"
    )
    return Finding("ppfeaturemask", WARN, value, advice)


def _rocm(host: HostFacts) -> list[Finding]:
    versions = sorted({version for _, version in host.rocm_installs})
    packages = dict(host.packages)
    if len(versions) > 1:
        where = ", ".join(f"{folder} {version}" for folder, version in host.rocm_installs)
        advice = "several ROCm versions are installed: check that ROCM_PATH, /opt/rocm and ld.so.conf agree"
        rocm = Finding("ROCm", WARN, where, advice)
    elif versions:
        rocm = Finding("ROCm", OK, f"{versions[0]} ({', '.join(f for f, _ in host.rocm_installs)})")
    elif "rocm-core" in packages:
        rocm = Finding("ROCm", OK, f"{packages['rocm-core']} (package rocm-core)")
    elif packages:
        upstream = ", ".join(sorted({version.split("-")[0].split(":")[-1] for version in packages.values()}))
        advice = "only packaged ROCm pieces are installed (listed below): HIP programs need the ROCm runtime"
        rocm = Finding("ROCm", WARN, f"no /opt/rocm*; distribution packages only ({upstream})", advice)
    else:
        advice = "no /opt/rocm*/.info/version: HIP programs need ROCm (the exporter itself does not)"
        rocm = Finding("ROCm", WARN, "no ROCm install found", advice)
    if not host.packages:
        return [rocm]
    return [rocm, Finding("ROCm packages", OK, ", ".join(f"{name} {version}" for name, version in host.packages))]


def _library(library: LibraryVersion) -> Finding:
    if not library.path:
        return Finding(library.name, OK, "not installed", "the exporter reads sysfs directly without it")
    if library.error:
        advice = "the library cannot be used; the exporter falls back to sysfs (--source=sysfs)"
        return Finding(library.name, WARN, f"{library.path}: {library.error}", advice)
    return Finding(library.name, OK, f"{library.version} ({library.path})")


def _devices(facts: Facts) -> list[Finding]:
    if facts.discovery_error:
        advice = "a GPU or its driver may be hung: see dmesg; a reboot or a GPU reset may be needed"
        return [Finding("devices", FAIL, facts.discovery_error, advice)]
    devices = facts.devices
    if not devices:
        advice = "no amdgpu-driven PCI device under /sys/class/drm: check lspci and dmesg | grep amdgpu"
        return [Finding("devices", FAIL, "no AMD GPU found", advice)]
    out = [Finding("devices", OK, f"{len(devices)} found")]
    by_model: dict[str, list[DeviceFacts]] = {}
    for device in devices:
        if device.identity.partition == 0:  # a socket's partitions share its board, VBIOS, firmware and link
            by_model.setdefault(device.identity.device_id, []).append(device)
    for device in devices:
        ident = device.identity
        found = [_answers(device, facts.read_timeout)]
        if device.health is not None:
            found.append(_health(device.health, facts.node))
        if ident.partition == 0 and ident.deployment == "guest":
            found += [_vbios(device, []), *_guest(device)]
        elif ident.partition == 0:
            siblings = [d for d in by_model[ident.device_id] if d is not device]
            found += [_vbios(device, siblings), _firmware(device, siblings), *_pcie(device)]
        if device.render_node:
            found.append(_node_access(os.path.join(facts.dev, "dri", device.render_node), facts.access))
        mode = ident.compute_partition
        part = f"{mode} {ident.partition}" if mode not in ("", "SPX") else ""
        out += [replace(f, gpu=device.gpu, pci_bus_id=ident.pci_bus_id, partition=part) for f in found]
    return out


def _answers(device: DeviceFacts, read_timeout: float) -> Finding:
    label = f"{device.identity.product or device.identity.device_id} {device.identity.serial}".strip()
    if device.up:
        return Finding("answers", OK, label)
    if device.down_reason == "timeout":
        advice = "the GPU is hung: see dmesg for ring timeouts; a GPU reset or reboot may be needed"
        return Finding("answers", FAIL, f"{label}: no answer within {read_timeout:g} s", advice)
    advice = "none of its sensors could be read: see dmesg | grep amdgpu"
    return Finding("answers", FAIL, f"{label}: {device.down_reason}", advice)


def _health(health: GpuHealth, node: str) -> Finding:
    """What the daemon's health verdict would say now (on this one read)."""
    if health.fit:
        return Finding("health", OK, "fit")
    worst = FAIL if any(c.severity == "critical" for c in health.checks) else WARN
    value = "not fit: " + "; ".join(f"{c.check}: {c.reason}" for c in health.checks)
    drain = drain_command(node, f"amdgpu-exporter: gpu {health.gpu} not fit")
    advice = (
        f"take the node out of service until it is fit: {drain} or {taint_command(node, f'gpu{health.gpu}')} "
        "(docs/health.md says when each check clears)"
    )
    return Finding("health", worst, value, advice)


def _majority(values: Sequence[str]) -> str:
    return Counter(values).most_common(1)[0][0] if values else ""


def _vbios(device: DeviceFacts, siblings: Sequence[DeviceFacts]) -> Finding:
    vbios = device.identity.vbios or "unknown"
    others = [d.identity.vbios for d in siblings if d.identity.vbios]
    if others and device.identity.vbios and device.identity.vbios not in others:
        advice = "VBIOS differs from the other boards of this model: flash the fleet's version (amdvbflash)"
        return Finding("vbios", WARN, f"{vbios} (its {len(others)} siblings: {_majority(others)})", advice)
    return Finding("vbios", OK, vbios)


def _firmware(device: DeviceFacts, siblings: Sequence[DeviceFacts]) -> Finding:
    mine = device.identity.firmware
    if not mine:
        advice = "cannot compare firmware; is the driver's debug info hidden?"
        return Finding("firmware", WARN, "no fw_version folder", advice)
    differs = []
    for block, version in sorted(mine.items()):
        others = [d.identity.firmware[block] for d in siblings if block in d.identity.firmware]
        if others and version not in others:
            differs.append(f"{block} {version} (siblings {_majority(others)})")
    if differs:
        advice = "update linux-firmware / amdgpu-firmware so every board of a model runs the same firmware"
        return Finding("firmware", WARN, "differs from its siblings: " + ", ".join(differs), advice)
    note = f", same as its {len(siblings)} sibling{'s' if len(siblings) != 1 else ''}" if siblings else ""
    return Finding("firmware", OK, f"{len(mine)} blocks{note}")


# What the host keeps from an SR-IOV virtual function, as a guest's sysfs shows it (a real MI300X
# VF: rocm-smi says "Not supported" for each).
GUEST_LIMITS = (
    "no serial number or product number (the FRU EEPROM is the host's)",
    "no firmware versions",
    "unique_id reads empty: the device is told apart by its PCI address (identity_source=pci_bus_id)",
    "power limits, clocks and partition modes are set on the host, not here",
    "the PCIe link is the hypervisor's virtual one, not the physical link",
)


def _guest(device: DeviceFacts) -> list[Finding]:
    """A virtual function in a VM: what it cannot see is the host's, not a fault to fix here."""
    product = device.identity.product or device.identity.device_id
    advice = "a guest cannot see: " + "; ".join(GUEST_LIMITS) + ". Ask the host's operator for those."
    found = [Finding("deployment", OK, f"guest: an SR-IOV virtual function ({product})", advice)]
    found.append(Finding("firmware", OK, "hidden from a guest (the host keeps the firmware versions)"))
    return found


def _pcie(device: DeviceFacts) -> list[Finding]:
    narrow = "the link trained narrow: reseat the board, check the riser/slot; a narrow link costs bandwidth"
    slow = "below maximum: normal when idle (PCIe power saving); if it stays low under load, check the slot"
    return [
        _link_check("PCIe width", "width", device.link_width, device.link_max_width, "x{}".format, FAIL, narrow),
        _link_check("PCIe speed", "speed", device.link_speed, device.link_max_speed, _gts, WARN, slow),
    ]


def _gts(transfers_per_second: float) -> str:
    return f"{transfers_per_second / 1e9:g} GT/s"


def _link_check(
    check: str, what: str, now: float | None, top: float | None, show: Callable[[float], str], status: str, advice: str
) -> Finding:
    """One half of a PCIe link's health: ok at its maximum, else `status` with `advice`."""
    if now is None or top is None:
        return Finding(check, WARN, "unreadable", f"cannot read current_link_{what} / max_link_{what}")
    if now < top:
        return Finding(check, status, f"{show(now)} of {show(top)}", advice)
    return Finding(check, OK, show(now))


def _environment(host: HostFacts, devices: Sequence[DeviceFacts]) -> list[Finding]:
    env = host.environment
    out = []
    override = env.get("HSA_OVERRIDE_GFX_VERSION")
    instinct = [d for d in devices if d.identity.asic in NATIVE_GFX]
    if override is not None and instinct:
        isa, native = NATIVE_GFX[instinct[0].identity.asic]
        why = (
            f"it equals the native {native} and changes nothing: remove it"
            if override.strip() == native
            else f"the runtime will load code built for {override} on a {isa} part: kernels may crash, "
            f"run slowly or compute wrongly (e.g. rocFFT paths); unset it — Instinct parts need no override"
        )
        out.append(Finding("HSA_OVERRIDE_GFX_VERSION", WARN, f"{override} on {isa} ({native})", why))
    # The override on an Instinct part has its own finding; elsewhere it is one variable among others.
    others = {name: value for name, value in env.items() if name != "HSA_OVERRIDE_GFX_VERSION" or not instinct}
    if others:
        listed = ", ".join(f"{name}={value}" for name, value in sorted(others.items()))
        out.append(Finding("HIP/HSA environment", OK, listed, "these change which GPUs HIP sees or how it runs"))
    elif override is None:
        out.append(Finding("HIP/HSA environment", OK, "no HIP/HSA/ROCR variable set"))
    return out


def _access(access: AccessFacts) -> list[Finding]:
    wanted = ("video", "render")
    missing = [g for g in wanted if g not in access.groups]
    if access.is_root:
        groups = Finding("groups", OK, f"{access.user} (root)")
    elif missing:
        advice = f"sudo usermod -aG {','.join(wanted)} {access.user} (then log in again)"
        groups = Finding("groups", WARN, f"{access.user} is not in {' or '.join(missing)}", advice)
    else:
        groups = Finding("groups", OK, f"{access.user} in video and render")
    kfd = next((path for path in access.nodes if os.path.basename(path) == "kfd"), None)
    return [groups] if kfd is None else [groups, _node_access(kfd, access)]


def _node_access(path: str, access: AccessFacts) -> Finding:
    state = access.nodes.get(path, "missing")
    check = "access " + os.path.basename(path)
    if state == "ok":
        return Finding(check, OK, f"{path} read/write")
    if state == "missing":
        advice = "the KFD / DRM node does not exist: is amdgpu loaded (and /dev passed into the container)?"
        return Finding(check, FAIL, f"{path} is missing", advice)
    advice = "add the user to the render and video groups, or pass the device to the container"
    return Finding(check, FAIL, f"{path}: permission denied for {access.user}", advice)


DROP_IN = (
    "for the systemd service install its drop-in: install -D -m 0644 /usr/share/amdgpu-exporter/systemd/debugfs.conf "
    "/etc/systemd/system/amdgpu-exporter.service.d/debugfs.conf (deploy/systemd/debugfs.conf), then restart it"
)
UNREAD = "the cper_* checks are silent and the bad-page threshold is estimated from the module parameter"


def _debugfs(debugfs: DebugfsFacts | None) -> list[Finding]:
    """Whether the CPER and exact bad-page-threshold signals can be read, and why not."""
    if debugfs is None:
        return []
    if debugfs.state == "not_mounted":
        advice = "mount -t debugfs none /sys/kernel/debug (systemd's sys-kernel-debug.mount does it at boot)"
        return [Finding("debugfs", WARN, f"not mounted at {debugfs.path}: {UNREAD}", advice)]
    if debugfs.state == "denied":
        value = f"{debugfs.path} is not readable by {debugfs.user} (mode 0700, root only): {UNREAD}"
        return [Finding("debugfs", WARN, value, f"run as root; {DROP_IN}")]
    if debugfs.state != "ok":
        return [Finding("debugfs", WARN, f"{debugfs.path}: {debugfs.state.removeprefix('error: ')}: {UNREAD}")]
    states = [state for files in debugfs.files.values() for state in files.values()]
    if "locked_down" in states:
        value = f"the kernel refuses debugfs reads (lockdown): {UNREAD}"
        return [Finding("debugfs", WARN, value, "cat /sys/kernel/security/lockdown; Secure Boot or lockdown= sets it")]
    if "denied" in states:
        value = f"files under {debugfs.path}/dri are not readable by {debugfs.user}: {UNREAD}"
        return [Finding("debugfs", WARN, value, f"run as root; {DROP_IN}")]
    total = len(debugfs.files)
    threshold = sum(files.get(DEBUGFS_FILES[0]) == "ok" for files in debugfs.files.values())
    cper = sum(files.get(DEBUGFS_FILES[1]) == "ok" for files in debugfs.files.values())
    value = (
        f"readable by {debugfs.user}: the driver's bad-page threshold on {threshold} of {total}, "
        f"a CPER ring on {cper} of {total} (MI300-class, kernel 6.15+)"
    )
    if debugfs.is_root:
        value += "; the systemd service (DynamicUser) reads it only with deploy/systemd/debugfs.conf"
    return [Finding("debugfs", OK, value)]


# -- output -----------------------------------------------------------------------------------


def render_text(findings: Sequence[Finding], *, now: float | None = None) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() if now is None else now))
    lines = [f"amdgpu-exporter doctor · {stamp}"]
    current_gpu: int | None = None
    for finding in findings:
        if finding.gpu is not None and finding.gpu != current_gpu:
            current_gpu = finding.gpu
            where = f" · partition {finding.partition}" if finding.partition else ""
            lines.append(f"GPU {finding.gpu} · {finding.pci_bus_id}{where}")
        indent = "  " if finding.gpu is not None else ""
        lines.append(f"{indent}{finding.status:<4}  {finding.check:<24} {finding.value}")
        if finding.status != OK and finding.advice:
            lines.append(f"{indent}      → {finding.advice}")
    counts = Counter(f.status for f in findings)
    lines.append(f"{counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines) + "\n"


def render_json(findings: Sequence[Finding], facts: Facts) -> str:
    counts = Counter(f.status for f in findings)
    document = {
        "status": FAIL if counts[FAIL] else (WARN if counts[WARN] else OK),
        "summary": {OK: counts[OK], WARN: counts[WARN], FAIL: counts[FAIL]},
        "findings": [asdict(f) for f in findings],
        "host": asdict(facts.host),
    }
    return json.dumps(document, indent=2, default=str) + "\n"


def run(settings: Settings, args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Gather, judge, print; 1 when any finding failed. The caller leaves with os._exit."""
    for flag, path in (("--path.procfs", args.path_procfs), ("--path.dev", args.path_dev)):
        if not os.path.isdir(path):
            raise ConfigError(f"{flag}: {path} is missing (no such folder)")
    from exporter.demo import sysfs_tree

    with sysfs_tree(settings) as sysfs:
        host = collect(sysfs, args.path_procfs, args.path_rocm, os.environ)
        devices, error = collect_devices(settings, sysfs)
        access = collect_access(args.path_dev, devices)
        debugfs = collect_debugfs(sysfs, devices, access, settings.read_timeout)
    facts = Facts(host, devices, error, settings.read_timeout, args.path_dev, access, node_name(settings), debugfs)
    findings = judge(facts)
    out = out or sys.stdout
    out.write(render_json(findings, facts) if args.json else render_text(findings))
    out.flush()
    return 1 if any(f.status == FAIL for f in findings) else 0
