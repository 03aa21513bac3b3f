"""The live status page at `/`: one tile per device, rendered on the server (so it reads without
JavaScript), then refreshed by a small inline script from /api/v1/devices and /api/v1/alerts.

No external asset of any kind (fonts, scripts, styles, images): the page works offline, on an
air-gapped cluster, and behind the web config's TLS and basic auth, because every URL it asks for
is relative to the page. Sparklines show the last minute: from the waveform API when the daemon
has one, otherwise from a history the script keeps of its own polls.
"""

from __future__ import annotations

import html
import socket
import time
from collections.abc import Collection, Sequence
from functools import cache
from importlib import resources

from exporter.exposition.views import (
    GIB,
    DeviceGroup,
    active_alerts,
    alert_state,
    group_devices,
    unreported,
    vram_used_total,
)
from exporter.model import AlertState, DeviceState, Snapshot

TEMPLATE = "status_page.html"


@cache
def _template() -> str:
    return resources.files("exporter.web").joinpath(TEMPLATE).read_text(encoding="utf-8")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _alert_items(alerts: Sequence[AlertState]) -> str:
    items = []
    for alert in alerts:
        text = f"{alert.alert} ({alert_state(alert)})" + (f": {alert.suggestion}" if alert.suggestion else "")
        items.append(f'<li class="{html.escape(alert.severity)}">{html.escape(text)}</li>')
    return "".join(items)


def _spark(name: str) -> str:
    return f'<svg class="spark" data-spark="{name}" viewBox="0 0 80 18" aria-hidden="true"><polyline points=""/></svg>'


def _power_text(device: DeviceState) -> str:
    sample = device.sample
    if sample is None:
        return "– / – W"
    return unreported(device).get("power") or f"{_fmt(sample.power_watts)} / {_fmt(sample.power_cap_watts)} W"


def _tile(group: DeviceGroup, device: DeviceState, alerts: Sequence[AlertState], sampled: bool) -> str:
    ident = device.identity
    sample = device.sample
    unit = group.unit_label(device)
    where = [ident.pci_bus_id]
    if group.partitioned:
        # the group's header names the socket and its modes; the tile says which part of it this is
        where.append(f"partition {unit[1:]}")
    elif len(group.devices) > 1:
        where.append(f"die {ident.die}")
    temps = sample.temperatures if sample is not None else {}
    busy = sample.busy.get("gfx") if sample is not None else None
    used, total = vram_used_total(sample) if sample is not None else (None, None)
    share = f"{100 * used / total:.1f}%" if used is not None and total else "0%"
    mine = active_alerts(alerts, device.gpu)
    classes = "tile" + ("" if device.up else " down") + (" alerting" if mine else "")
    state = "up" if device.up else f"down: {device.down_reason or '?'}"
    title = f"GPU {device.gpu}" + (f" · {unit}" if unit else "")
    wave = ' data-waveform="1"' if sampled else ""
    rows = [
        ("junction", "junction", f"{_fmt(temps.get('junction'))} °C", _spark("junction")),
        ("edge/mem", "edge_memory", f"{_fmt(temps.get('edge'))} / {_fmt(temps.get('memory'))} °C", ""),
        ("power", "power", _power_text(device), _spark("power")),
        (
            "busy",
            "busy",
            unreported(device).get("busy", "–") if busy is None else f"{busy * 100:.0f} %",
            _spark("busy"),
        ),
        (
            "VRAM",
            "vram",
            f"{_fmt(None if used is None else used / GIB, 1)} / {_fmt(None if total is None else total / GIB)} GiB",
            f'<div class="bar"><span data-field="vram_bar" style="width:{share}"></span></div>',
        ),
    ]
    body = "".join(
        f'<span class="k">{label}</span><span class="v" data-field="{field}">{html.escape(value)}</span>'
        f"<span>{extra}</span>"
        for label, field, value, extra in rows
    )
    return (
        f'<article class="{classes}" id="gpu-{device.gpu}" data-gpu="{device.gpu}"{wave} '
        f'data-pci-bus-id="{html.escape(ident.pci_bus_id)}">'
        f'<div class="head"><span>{html.escape(title)}</span>'
        f'<span class="state{"" if device.up else " down"}">{html.escape(state)}</span></div>'
        f'<div class="where">{html.escape(" · ".join(where))}</div>'
        f'<div class="rows">{body}</div>'
        f'<ul class="alerts">{_alert_items(mine)}</ul></article>'
    )


def render_status_page(
    snapshot: Snapshot | None,
    alerts: Sequence[AlertState] = (),
    *,
    version: str,
    source: str,
    telemetry_path: str = "/metrics",
    refresh_seconds: float = 1.0,
    waveform_url: str = "",
    waveform_gpus: Collection[int] = (),
    waveform_seconds: float = 60.0,
    host: str | None = None,
) -> str:
    """The whole page. waveform_url: a relative URL with '{gpu}' in it for the recent fast samples of
    the devices in waveform_gpus (the sampled ones: asking for another would be a 404), or ""."""
    devices = snapshot.devices if snapshot is not None else ()
    groups = []
    for group in group_devices(devices):
        tiles = "".join(
            _tile(group, device, alerts, bool(waveform_url) and device.gpu in waveform_gpus) for device in group.devices
        )
        title = html.escape(group.title)
        groups.append(f'<section class="group"><h2>{title}</h2><div class="tiles">{tiles}</div></section>')
    if snapshot is None:
        groups.append("<p>Waiting for the first poll cycle…</p>")
    up = sum(1 for d in devices if d.up)
    summary = f"{len(devices)} devices, {up} up · source {source}"
    updated = (
        "cycle {} · {}".format(snapshot.cycle, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snapshot.taken_at)))
        if snapshot is not None
        else "no data yet"
    )
    # Relative links: right behind a reverse proxy that mounts the exporter under a prefix.
    links = (telemetry_path, "/api/v1/devices", "/api/v1/alerts", "/healthz", "/readyz")
    refresh_ms = max(250, round(refresh_seconds * 1000))
    values = {
        "HOST": html.escape(host if host is not None else socket.gethostname()),
        "VERSION": html.escape(version),
        "SUMMARY": html.escape(summary),
        "UPDATED": html.escape(updated),
        "LINKS": "".join(f'<a href="{html.escape(path.lstrip("/"))}">{html.escape(path)}</a>' for path in links),
        "REFRESH_MS": str(refresh_ms),
        "REFRESH_TEXT": f"{refresh_ms / 1000:g} s",
        "WAVEFORM_URL": html.escape(waveform_url),
        "SPARK_TEXT": (
            f"the last {waveform_seconds:g} s of fast samples" if waveform_url and waveform_gpus else "the last minute"
        ),
        "GROUPS": "\n".join(groups),
    }
    page = _template()
    for key, value in values.items():
        page = page.replace(f"%%{key}%%", value)
    return page
