"""A snapshot as an 80-column text table: what `watch rocm-smi --showpower --showtemp --showuse`
shows, plus VRAM, clocks, PCIe link, ECC, the health verdict, throttling and the in-daemon
suggestions (the clock-down advice, the drain/taint commands of an unfit GPU).

Pure: (devices, alerts, health verdict, when) -> str. The devices of one package or socket are listed under one
header line (exposition/views.py groups them).
"""

from __future__ import annotations

import re
import textwrap
import time
from collections.abc import Callable, Sequence

from exporter.exposition.views import GIB, active_alerts, alert_state, group_devices, health_of, vram_used_total
from exporter.model import AlertState, DeviceState, GpuHealth, HealthVerdict, Sample

WIDTH = 80
# GPU unit temps power busy vram clocks pcie ecc health
_ROW = "{gpu:>3} {unit:<3} {temps:<11} {power:<9} {busy:>4} {vram:<10} {clocks:<9} {pcie:<12} {ecc:<7} {fit:<3}"
HEADER = _ROW.format(
    gpu="GPU",
    unit="",
    temps="edge/jn/mem",
    power="power/cap",
    busy="gfx",
    vram="VRAM GiB",
    clocks="MHz g/m",
    pcie="PCIe link",
    ecc="ECC c/u",
    fit="fit",
).rstrip()
_INDENT = " " * 8


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _temps(sample: Sample) -> str:
    t = sample.temperatures
    return "/".join(f"{_num(t.get(s)):>3}" for s in ("edge", "junction", "memory"))


def _pair(first: float | None, second: float | None, scale: float, first_fmt: str = "{:.0f}", pad: int = 4) -> str:
    """'first/second' in units of `scale`, the first right-aligned in `pad` columns; '-' when neither is known."""
    if first is None and second is None:
        return f"{'-':>{pad}}"
    first_text = _num(None if first is None else first / scale, first_fmt)
    return f"{first_text:>{pad}}/{_num(None if second is None else second / scale)}"


def _busy(sample: Sample) -> str:
    gfx = sample.busy.get("gfx")
    return "-" if gfx is None else f"{gfx * 100:.0f}%"


def _gts(value: float) -> str:
    return f"{value / 1e9:g}"


def _with_max(value: float | None, top: float | None, show: Callable[[float], str]) -> str:
    """The value, and its maximum after a slash when it is below it."""
    if value is None:
        return "-"
    return f"{show(value)}/{show(top)}" if top is not None and value < top else show(value)


def pcie_link(sample: Sample) -> str:
    """'16GT x16'; a link below its maximum shows the maximum too: '8/16GT x8/16'."""
    speed, width = sample.pcie_link_transfers_per_second, sample.pcie_link_width
    if speed is None and width is None:
        return "-"
    speed_text = _with_max(speed, sample.pcie_max_link_transfers_per_second, _gts)
    return f"{speed_text}GT x{_with_max(width, sample.pcie_max_link_width, str)}"


def _ecc(sample: Sample) -> str:
    if not sample.ecc_errors:
        return "-"
    correctable = sum(v for (_, kind), v in sample.ecc_errors.items() if kind == "correctable")
    uncorrectable = sum(v for (_, kind), v in sample.ecc_errors.items() if kind == "uncorrectable")
    return f"{correctable}/{uncorrectable}"


def _age(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )


def _fit(health: GpuHealth | None) -> str:
    return "-" if health is None else ("yes" if health.fit else "NO")


def _health_lines(health: GpuHealth | None, now: float) -> list[str]:
    lines: list[str] = []
    for check in health.checks if health is not None else ():
        text = f"x {check.check} ({check.severity}, {_age(now - check.since)}): {check.reason}"
        lines += textwrap.wrap(
            text, WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT + "  ", break_on_hyphens=False
        )
    return lines


def _device_lines(
    device: DeviceState, unit: str, alerts: Sequence[AlertState], now: float, health: GpuHealth | None = None
) -> list[str]:
    sample = device.sample
    if not device.up:
        age = f", last sample {now - sample.timestamp:.0f} s ago" if sample is not None else ""
        fit = f" fit: {_fit(health)}" if health is not None else ""
        lines = [f"{device.gpu:>3} {unit:<3} DOWN ({device.down_reason or 'unknown'}{age}){fit}"]
    else:
        assert sample is not None
        row = _ROW.format(
            gpu=device.gpu,
            unit=unit,
            temps=_temps(sample),
            # the second die of an MI250X shows no power: its package is measured on die 0
            power=_pair(sample.power_watts, sample.power_cap_watts, 1),
            busy=_busy(sample),
            vram=_pair(*vram_used_total(sample), GIB, "{:.1f}", pad=5),
            clocks=_pair(sample.clocks_hertz.get("gfx"), sample.clocks_hertz.get("memory"), 1e6),
            pcie=pcie_link(sample),
            ecc=_ecc(sample),
            fit=_fit(health),
        )
        lines = [row.rstrip()]
        throttled = sorted(reason for reason, active in sample.throttle.items() if active)
        if throttled:
            lines += textwrap.wrap(
                "throttling: " + ", ".join(throttled), WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT + "  "
            )
    lines += _health_lines(health, now)
    for alert in alerts:
        text = f"! {alert.alert} ({alert.severity}, {alert_state(alert)})"
        if alert.suggestion:
            text += ": " + " ".join(alert.suggestion.split())
        lines += textwrap.wrap(
            text, WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT + "  ", break_on_hyphens=False
        )
    return lines


def render_table(
    devices: Sequence[DeviceState],
    alerts: Sequence[AlertState] = (),
    *,
    source: str = "",
    taken_at: float | None = None,
    health: HealthVerdict | None = None,
) -> str:
    """The whole table, every line at most 80 columns, ending in a newline."""
    now = time.time() if taken_at is None else taken_at
    down = sum(1 for d in devices if not d.up)
    title = f"amdgpu-exporter snapshot · {len(devices)} device{'s' if len(devices) != 1 else ''}"
    if down:
        title += f" ({down} down)"
    if source:
        title += f" · {source}"
    title += " · " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    lines = [title[:WIDTH], HEADER]
    for group in group_devices(devices):
        lines.append(f"── {group.title} "[:WIDTH].ljust(WIDTH, "─"))
        for device in group.devices:
            verdict = health_of(health, device.gpu) if health is not None else None
            lines += _device_lines(device, group.unit_label(device), active_alerts(alerts, device.gpu), now, verdict)
    if not devices:
        lines.append("no devices")
    if health is not None and health.suggestion:
        lines += textwrap.wrap(
            "health: " + health.suggestion,
            WIDTH,
            subsequent_indent="  ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    return "\n".join(terminal_safe(line)[:WIDTH] for line in lines) + "\n"


# C0 controls (newline included: each line is one), DEL and C1 controls: a terminal acts on them
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # no encoding takes a lone one: it would end `snapshot`


def terminal_safe(text: str) -> str:
    """text with every control character shown as an escape (ESC as \\x1b), never sent raw: a CPER
    record id, a pod or job name or any file's text must not set the terminal's title or colours."""
    return _SURROGATE.sub("\ufffd", _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text))
