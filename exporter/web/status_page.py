"""The live status page at `/`: one tile per device, rendered on the server (so it reads without
JavaScript), then refreshed by a small inline script from /api/v1/devices and /api/v1/alerts.

Made to be read from across a room: the node's name large at the top, active alerts in a banner
above the tiles, and each temperature and the power coloured by the loaded alert rules that watch
it (a site's tuned rule file colours the page as it alerts; nothing here repeats a threshold). With
many devices (a node of CPX partitions) the tiles go dense, so 64 fit one 1920x1080 screen.

No external asset of any kind (fonts, scripts, styles, images): the page works offline, on an
air-gapped cluster, and behind the web config's TLS and basic auth, because every URL it asks for
is relative to the page. Sparklines show the last minute: from the waveform API when the daemon
has one, otherwise from a history the script keeps of its own polls.
"""

from __future__ import annotations

import html
import json
import socket
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import cache
from importlib import resources

from exporter.alerting.rules import COMPARISONS, SEVERITIES, Rule
from exporter.alerting.watch import WATCHABLE
from exporter.exposition.views import (
    GIB,
    DeviceGroup,
    active_alerts,
    alert_state,
    group_devices,
    health_of,
    health_text,
    unreported,
    vram_used_total,
)
from exporter.model import AlertState, DeviceState, GpuHealth, HealthVerdict, Snapshot

TEMPLATE = "status_page.html"

# Above this many devices the tiles go dense (no sparklines, two values a line): 8 sockets of CPX
# partitions (64) fit one 1920x1080 screen; 16 ordinary tiles still fit it.
DENSE_ABOVE = 16

# The tile values the rules colour: field -> the rule metric and key that watch it.
COLOURED: Mapping[str, tuple[str, str | None]] = {
    "junction": ("temperature_celsius", "junction"),
    "edge": ("temperature_celsius", "edge"),
    "memory": ("temperature_celsius", "memory"),
    "power": ("power_watts", None),
}
# A value on the hot side of a rule's clear threshold but not past its threshold: an alert that
# fires stays firing there, so it is drawn as "near" (below every severity).
LEVELS = ("near", *SEVERITIES)
BANNER_DEVICES = 8  # devices named on one line of the banner before "and N more"

Limit = tuple[str, float, float, str]  # comparison, threshold, clear_threshold, severity


def colour_limits(rules: Iterable[Rule], asic: str) -> dict[str, list[Limit]]:
    """What colours each field of a device of this ASIC: the rules watching it, as they apply to it."""
    limits: dict[str, list[Limit]] = {}
    for rule in rules:
        applied = rule.for_asic(asic)
        for field, watched in COLOURED.items():
            if (applied.metric, applied.key) == watched:
                limits.setdefault(field, []).append(
                    (applied.comparison, applied.threshold, applied.clear_threshold, applied.severity)
                )
    return limits


def level(value: float | None, limits: Sequence[Limit]) -> str:
    """The highest of LEVELS the value reaches under these limits, "" for none (the page's script
    has the same function, for the values it refreshes)."""
    found = ""
    if value is None:
        return found
    for comparison, threshold, clear, severity in limits:
        compare = COMPARISONS[comparison]
        reached = severity if compare(value, threshold) else ("near" if compare(value, clear) else "")
        if reached and (not found or LEVELS.index(reached) > LEVELS.index(found)):
            found = reached
    return found


def _coloured(field: str, text: str, value: float | None, limits: Mapping[str, Sequence[Limit]]) -> str:
    tone = level(value, limits.get(field, ()))
    tone_class = f' class="lvl-{tone}"' if tone else ""
    return f'<span data-field="{field}"{tone_class}>{html.escape(text)}</span>'


@cache
def _template() -> str:
    return resources.files("exporter.web").joinpath(TEMPLATE).read_text(encoding="utf-8")


def _fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _alert_text(alert: AlertState) -> str:
    return f"{alert.alert} ({alert_state(alert)})" + (f": {alert.suggestion}" if alert.suggestion else "")


def _alert_items(alerts: Sequence[AlertState]) -> str:
    return "".join(f'<li class="{html.escape(a.severity)}">{html.escape(_alert_text(a))}</li>' for a in alerts)


def _banner(alerts: Sequence[AlertState], units: Mapping[str, str]) -> tuple[str, str]:
    """The banner's class and items: one line per alert and state, firing first, the most severe
    first, naming its devices and values (and the suggestion where one device has it)."""
    lines: dict[tuple[str, str, str], list[AlertState]] = {}
    for alert in alerts:
        state = alert_state(alert)
        if state != "inactive":
            lines.setdefault((state, alert.severity, alert.alert), []).append(alert)
    order = sorted(lines, key=lambda k: (k[0] != "firing", -SEVERITIES.index(k[1]), k[2]))
    items = []
    for state, severity, name in order:
        members = sorted(lines[(state, severity, name)], key=lambda a: a.gpu)
        unit = units.get(name, "")
        where = ", ".join(
            f"GPU {a.gpu}" + (f" ({a.value:.4g}{unit})" if a.value is not None else "")
            for a in members[:BANNER_DEVICES]
        )
        if len(members) > BANNER_DEVICES:
            where += f" and {len(members) - BANNER_DEVICES} more"
        text = f"{name} {state} on {where}"
        if len(members) == 1 and members[0].suggestion:
            text += f": {members[0].suggestion}"
        items.append(f'<li class="{state} {html.escape(severity)}">{html.escape(text)}</li>')
    firing = [k for k in order if k[0] == "firing"]
    tone = firing[0][1] if firing else ("pending" if order else "")
    return tone, "".join(items)


def _spark(name: str) -> str:
    return f'<svg class="spark" data-spark="{name}" viewBox="0 0 80 18" aria-hidden="true"><polyline points=""/></svg>'


def _power_text(device: DeviceState) -> str:
    sample = device.sample
    if sample is None:
        return "– / – W"
    return unreported(device).get("power") or f"{_fmt(sample.power_watts)} / {_fmt(sample.power_cap_watts)} W"


def _tile(
    group: DeviceGroup,
    device: DeviceState,
    alerts: Sequence[AlertState],
    sampled: bool,
    limits: Mapping[str, Sequence[Limit]],
    health: GpuHealth | None = None,
) -> str:
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
    edge, memory = temps.get("edge"), temps.get("memory")
    rows = [
        (
            "junction",
            _coloured("junction", f"{_fmt(temps.get('junction'))} °C", temps.get("junction"), limits),
            "spark",
        ),
        (
            "edge/mem",
            _coloured("edge", _fmt(edge), edge, limits)
            + " / "
            + _coloured("memory", _fmt(memory), memory, limits)
            + " °C",
            "",
        ),
        ("power", _coloured("power", _power_text(device), sample.power_watts if sample else None, limits), "spark"),
        (
            "busy",
            _coloured("busy", unreported(device).get("busy", "–") if busy is None else f"{busy * 100:.0f} %", None, {}),
            "spark",
        ),
        (
            "VRAM",
            _coloured(
                "vram",
                f"{_fmt(None if used is None else used / GIB, 1)} / {_fmt(None if total is None else total / GIB)} GiB",
                None,
                {},
            ),
            f'<div class="bar"><span data-field="vram_bar" style="width:{share}"></span></div>',
        ),
    ]
    # the row's field and its label in dense tiles
    fields = (("junction", "jct"), ("edge_memory", "e/m"), ("power", "pwr"), ("busy", "busy"), ("vram", "vram"))
    body = "".join(
        f'<span class="k" data-short="{short}">{label}</span><span class="v" data-row="{field}">{value}</span>'
        f'<span class="x">{_spark(field) if extra == "spark" else extra}</span>'
        for (field, short), (label, value, extra) in zip(fields, rows, strict=True)
    )
    return (
        f'<article class="{classes}" id="gpu-{device.gpu}" data-gpu="{device.gpu}"{wave} '
        f'data-asic="{html.escape(ident.asic)}" data-pci-bus-id="{html.escape(ident.pci_bus_id)}" '
        f'title="{html.escape(" · ".join(where))}">'
        f'<div class="head"><span>{html.escape(title)}</span>'
        f'<span class="state{"" if device.up else " down"}">{html.escape(state)}</span></div>'
        f'<div class="where">{html.escape(" · ".join(where))}</div>'
        f"{_health_line(health)}"
        f'<div class="rows">{body}</div>'
        f'<ul class="alerts">{_alert_items(mine)}</ul></article>'
    )


def _health_line(health: GpuHealth | None) -> str:
    """The verdict on the tile (the page's script keeps it current from /api/v1/health); the reasons
    are its tooltip."""
    if health is None:
        return '<div class="health" data-field="health">health: –</div>'
    reasons = html.escape("\n".join(f"{c.check}: {c.reason}" for c in health.checks))
    unfit = "" if health.fit else " unfit"
    text = html.escape(health_text(health))
    return f'<div class="health{unfit}" data-field="health" title="{reasons}">health: {text}</div>'


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
    node: str | None = None,
    rules: Sequence[Rule] = (),
    health: HealthVerdict | None = None,
) -> str:
    """The whole page. waveform_url: a relative URL with '{gpu}' in it for the recent fast samples of
    the devices in waveform_gpus (the sampled ones: asking for another would be a 404), or "".
    rules: the loaded alert rules, which colour the values they watch."""
    devices = snapshot.devices if snapshot is not None else ()
    # what the script colours and labels with: the limits per ASIC, the unit of each alert's value
    limits = {asic: colour_limits(rules, asic) for asic in sorted({d.identity.asic for d in devices})}
    units = {rule.alert: WATCHABLE[rule.metric].unit for rule in rules}
    groups = []
    for group in group_devices(devices):
        tiles = "".join(
            _tile(
                group,
                device,
                alerts,
                bool(waveform_url) and device.gpu in waveform_gpus,
                limits[device.identity.asic],
                health_of(health, device.gpu) if health is not None else None,
            )
            for device in group.devices
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
    tone, banner = _banner(alerts, units)
    # Relative links: right behind a reverse proxy that mounts the exporter under a prefix.
    links = (telemetry_path, "/api/v1/devices", "/api/v1/alerts", "/api/v1/health", "/healthz", "/readyz")
    refresh_ms = max(250, round(refresh_seconds * 1000))
    values = {
        "NODE": html.escape(node if node is not None else socket.gethostname()),
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
        "DENSE": "dense" if len(devices) > DENSE_ABOVE else "",
        "BANNER_CLASS": f"banner {tone}" if tone else "banner",
        "BANNER_HIDDEN": "" if banner else " hidden",
        "BANNER": banner,
        # inside <script>: no "</" can end it early
        "RULES": json.dumps({"limits": limits, "units": units}, sort_keys=True).replace("<", "\\u003c"),
        "GROUPS": "\n".join(groups),
    }
    page = _template()
    for key, value in values.items():
        page = page.replace(f"%%{key}%%", value)
    return page
