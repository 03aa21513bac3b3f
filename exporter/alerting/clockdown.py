"""The clock-down suggestion: which gfx clock ceiling to advise, and the commands that set and undo it.

Pure functions; nothing here touches a GPU. The field notes' rule is "above 85 °C, take 5 % off the
clock". Taken literally against the clock's *maximum* it can advise a ceiling above what a hot GPU
is already holding by itself (the firmware throttles first), which changes nothing. So a step
starts from what the device is doing now: the lower of its current gfx clock and the ceiling
advised before. A ceiling is then held to

- never above the current gfx clock (nor the table's top),
- never below the floor (floor_ratio of the gfx clock maximum) nor the DPM table's lowest level,
- a whole MHz (the tools take integers), and on a table of discrete levels a real level where one
  lies between the floor and the target.

When the floor and the current clock leave no room (a device already throttled below the floor),
no lower ceiling is advised.

The commands run without a prompt: rocm-smi's --setsrange asks to accept an out-of-spec warning
unless --autorespond answers it. The undo is one command per tool, the same in the daemon's
suggestions, the API, the push and docs/runbooks.md.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A pp_dpm_sclk of at most this many lines is a fine-grained range (SMU 13, Aldebaran and MI300:
# min, the current clock when between, max): any MHz in it can be set; a longer one lists levels.
RANGE_TABLE_MAX_LEVELS = 3
TOOLS = ("rocm-smi", "amd-smi")


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A suggested gfx clock ceiling in whole MHz; at_floor when no lower one will be suggested."""

    mhz: int
    at_floor: bool


def next_ceiling(
    *,
    current_hertz: float | None,
    previous_ceiling_hertz: float | None,
    max_hertz: float | None,
    levels_hertz: Sequence[float] = (),
    step_ratio: float,
    floor_ratio: float,
) -> Ceiling | None:
    """The next ceiling one step below what the device does now; None when nothing lower can be advised."""
    known = [h for h in (current_hertz, previous_ceiling_hertz) if h is not None and math.isfinite(h) and h > 0]
    top = max_hertz if max_hertz is not None and math.isfinite(max_hertz) and max_hertz > 0 else None
    levels = sorted(h for h in levels_hertz if math.isfinite(h) and h > 0)
    if top is None and levels:
        top = levels[-1]
    if not known and top is None:
        return None
    # Never above its maximum; when nothing says what it runs at, it starts from there.
    running = min([*known, top] if top is not None else known)
    low = levels[0] if levels else 0.0
    floor = floor_ratio * top if top is not None else 0.0
    lo_mhz = math.ceil(max(low, floor) / 1e6 - 1e-6)
    hi_mhz = math.floor(running / 1e6 + 1e-6)
    if lo_mhz > hi_mhz:
        return None
    target_mhz = math.floor(running * (1.0 - step_ratio) / 1e6 + 1e-6)
    mhz = min(max(target_mhz, lo_mhz), hi_mhz)
    lowest = lo_mhz
    if len(levels) > RANGE_TABLE_MAX_LEVELS:
        real = sorted({round(h / 1e6) for h in levels if lo_mhz <= round(h / 1e6) <= hi_mhz})
        if real:
            below = [level for level in real if level <= target_mhz]
            # Else the nearest real level above the target, still at or below the current clock.
            mhz = below[-1] if below else real[0]
            lowest = real[0]
    return Ceiling(mhz=mhz, at_floor=mhz <= lowest)


# The ASICs amd-smi drives and rocm-smi only partly does (DeviceIdentity.asic: MI300X / MI300A /
# MI325X, MI350): amd-smi is AMD's tool for them.
AMD_SMI_ASICS = frozenset({"aqua_vanjaram", "gfx950"})


def find_tool(preference: str = "auto", *, asics: Iterable[str] = (), rocm_versions: Iterable[str] = ()) -> str:
    """The tool the commands are written for: as configured; with "auto", amd-smi when it is on PATH
    and can drive the device (a ROCm 6 or later install, or an MI300-class ASIC), else rocm-smi when
    it is on PATH, else amd-smi when it is, else rocm-smi (what the field notes use)."""
    if preference in TOOLS:
        return preference
    on_path = {tool for tool in TOOLS if shutil.which(tool) is not None}
    modern = any(_major(version) >= 6 for version in rocm_versions) or any(asic in AMD_SMI_ASICS for asic in asics)
    if "amd-smi" in on_path and (modern or "rocm-smi" not in on_path):
        return "amd-smi"
    return "rocm-smi"


def _major(version: str) -> int:
    """6 for '6.4.1'; 0 when the text does not start with a number."""
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def set_ceiling_command(tool: str, smi_index: int, pci_bus_id: str, min_mhz: int, max_mhz: int) -> str:
    """The command that sets the gfx clock range of one device, without an interactive prompt."""
    if tool == "amd-smi":
        # amd-smi takes a PCI address for --gpu, which does not depend on enumeration order.
        return f"amd-smi set --gpu {pci_bus_id} --clk-limit sclk max {max_mhz}"
    return f"rocm-smi -d {smi_index} --autorespond yes --setsrange {min(min_mhz, max_mhz)} {max_mhz}"


def undo_command(tool: str, smi_index: int, pci_bus_id: str) -> str:
    """The one command that undoes any ceiling suggested for the device (clocks back to the driver's default)."""
    if tool == "amd-smi":
        return f"amd-smi reset --gpu {pci_bus_id} --clocks"
    return f"rocm-smi -d {smi_index} --resetclocks"
