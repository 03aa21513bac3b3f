"""`job-report`: a job document (accounting/document.py) as text or as one self-contained HTML page
(inline CSS and SVG plots of power, gfx busy and junction temperature per GPU; no external asset).
Pure: document in, str out."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any

_COLOURS = ("#2f6fde", "#e2611a", "#2a9d50", "#b83dba", "#c49a00", "#17a2b8", "#d63a4a", "#6b6b6b")


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _energy(joules: float) -> str:
    kwh = joules / 3.6e6
    return f"{joules:,.0f} J ({kwh:.3f} kWh)" if kwh >= 0.001 else f"{joules:,.1f} J"


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:,.2f} GiB"


def _pairs(values: Mapping[str, float], unit: str = "", digits: int = 0) -> str:
    shown = [f"{k} {v:,.{digits}f}{unit}" for k, v in sorted(values.items()) if v]
    return ", ".join(shown) or "none"


def _device_name(device: Mapping[str, Any]) -> str:
    product = (device.get("product") or "").removeprefix("AMD Instinct ") or "GPU"
    where = device.get("place") or ""
    return f"gpu {device['gpu']} ({product}, {where})" if where else f"gpu {device['gpu']} ({product})"


def render_text(doc: Mapping[str, Any]) -> str:
    totals = doc["totals"]
    labels = " ".join(f"{k}={v}" for k, v in sorted(doc["labels"].items()) if k != "job_id")
    lines = [
        f"{doc['scheduler']} job {doc['job_id']} on {doc['node'] or 'this node'}: {doc['state']}"
        + (f" ({labels})" if labels else ""),
        f"  from {_when(doc['started_at'])} to {_when(doc['ended_at']) if doc['ended_at'] else 'now'}"
        f" ({_duration(doc['duration_seconds'])}), GPUs {', '.join(map(str, doc['gpus'])) or '-'}",
        f"  energy        {_energy(totals['energy_joules'])}, mean {_num(totals['mean_power_watts'], ' W')}",
        f"  GPU time      {totals['gpu_seconds']:,.1f} GPU-s ({totals['gpu_hours']:.4f} GPU-h)",
        f"  busy          {_pairs(totals['busy_seconds'], ' s', 1)}",
        f"  peak temp     {_pairs(totals['peak_temperatures_celsius'], ' °C')}",
        f"  VRAM peak     {_gib(totals['vram_peak_bytes'])}",
        f"  throttled     {_pairs(totals['throttled_seconds'], ' s', 1)}",
        f"  errors        {_pairs(totals['errors'])}",
        f"  health        {', '.join(totals['failed_checks']) or 'no check failed'}",
        "",
        f"  {'GPU':<28} {'held s':>9} {'energy J':>11} {'mean W':>7} {'peak W':>7} {'gfx %':>6}"
        f" {'Tj max':>6} {'VRAM peak':>11}",
    ]
    for device in doc["devices"]:
        gfx = device["mean_busy_ratio"].get("gfx")
        lines.append(
            f"  {_device_name(device):<28} {device['held_seconds']:>9.1f} {device['energy_joules']:>11,.1f}"
            f" {_num(device['mean_power_watts']):>7} {_num(device['peak_power_watts']):>7}"
            f" {_num(gfx * 100 if gfx is not None else None):>6}"
            f" {_num(device['peak_temperatures_celsius'].get('junction')):>6} {_gib(device['vram_peak_bytes']):>11}"
        )
    lines += ["", f"  energy split: {doc['split_rule']}"]
    return "\n".join(lines) + "\n"


def _elapsed(seconds: float, span: float) -> str:
    """An x-axis label: time since the job's first point, in the unit its length reads best in."""
    if span >= 3 * 3600:
        return f"{seconds / 3600:.1f} h"
    if span >= 180:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _plot(
    title: str,
    unit: str,
    series: Sequence[tuple[str, Sequence[float], Sequence[float | None]]],
    top: float | None = None,
) -> str:
    """One SVG line chart: (name, times, values) per GPU, time on x (minutes from the first point)."""
    width, height, left, right, upper, lower = 560, 200, 48, 30, 24, 28
    points = [(t, v) for _, times, values in series for t, v in zip(times, values, strict=False) if v is not None]
    if not points:
        return f'<figure class="plot"><figcaption>{html.escape(title)}</figcaption><p class="none">no data</p></figure>'
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    high = top if top is not None else max(p[1] for p in points) * 1.1 or 1.0
    span = (t1 - t0) or 1.0

    def x(t: float) -> float:
        return left + (t - t0) / span * (width - left - right)

    def y(v: float) -> float:
        return upper + (1 - v / high) * (height - upper - lower)

    parts = [
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img"'
        f' aria-label="{html.escape(title)}">'
    ]
    for step in range(5):
        value = high * step / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{y(value) + 4:.1f}" class="axis" text-anchor="end">{value:.0f}</text>')
    for step in range(5):
        t = t0 + span * step / 4
        parts.append(
            f'<text x="{x(t):.1f}" y="{height - 8}" class="axis" text-anchor="middle">{_elapsed(t - t0, span)}</text>'
        )
    for index, (name, times, values) in enumerate(series):
        colour = _COLOURS[index % len(_COLOURS)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in zip(times, values, strict=False) if v is not None)
        if path:
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.8">'
                f"<title>{html.escape(name)}</title></polyline>"
            )
    parts.append(f'<text x="{left}" y="14" class="unit">{html.escape(unit)}</text></svg>')
    legend = "".join(
        f'<span><i style="background:{_COLOURS[i % len(_COLOURS)]}"></i>{html.escape(name)}</span>'
        for i, (name, _, _) in enumerate(series)
    )
    caption = f"<figcaption>{html.escape(title)}</figcaption>"
    return f'<figure class="plot">{caption}{"".join(parts)}<div class="legend">{legend}</div></figure>'


_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c3c8d4}main{padding:20px 28px;max-width:1240px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:12px;margin-bottom:18px}
.card{background:#fff;border-radius:8px;padding:12px 14px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.card b{display:block;font-size:20px;margin-top:2px}.card span{color:#5b6475;font-size:12px;text-transform:uppercase}
.bad b{color:#c62828}.ok b{color:#2a9d50}
table{border-collapse:collapse;width:100%;background:#fff;border-radius:8px;overflow:hidden;
box-shadow:0 1px 2px rgba(0,0,0,.08)}
th,td{padding:7px 10px;text-align:right;border-bottom:1px solid #eceef2;white-space:nowrap}
th{background:#fafbfc;color:#5b6475;font-weight:600}
td:first-child,th:first-child{text-align:left}
td:nth-last-child(-n+2),th:nth-last-child(-n+2){white-space:normal;text-align:left;min-width:110px}
.plots{display:flex;flex-wrap:wrap;gap:14px;margin:18px 0}
.plot{background:#fff;border-radius:8px;margin:0;padding:10px 12px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.plot figcaption{font-weight:600;margin-bottom:4px}.grid{stroke:#e4e7ec}.axis{font-size:10px;fill:#6b7385}
.unit{font-size:11px;fill:#6b7385}.legend span{margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px}
.none{color:#6b7385}footer{color:#6b7385;font-size:12px;margin-top:18px}
"""


def render_html(doc: Mapping[str, Any]) -> str:
    totals = doc["totals"]
    esc = html.escape
    labels = ", ".join(f"{k}={v}" for k, v in sorted(doc["labels"].items()) if k != "job_id")
    failed = totals["failed_checks"]
    errors = sum(totals["errors"].values())
    cards = [
        ("Energy", _energy(totals["energy_joules"]), ""),
        ("GPU time", f"{totals['gpu_hours']:.3f} GPU-h", ""),
        ("Mean power", _num(totals["mean_power_watts"], " W"), ""),
        ("Duration", _duration(doc["duration_seconds"]), ""),
        ("Peak junction", _num(totals["peak_temperatures_celsius"].get("junction"), " °C"), ""),
        ("VRAM peak", _gib(totals["vram_peak_bytes"]), ""),
        ("Errors", f"{errors:,.0f}", "bad" if errors else "ok"),
        ("Health", ", ".join(failed) if failed else "all checks passed", "bad" if failed else "ok"),
    ]
    rows = []
    for device in doc["devices"]:
        gfx = device["mean_busy_ratio"].get("gfx")
        memory = device["mean_busy_ratio"].get("memory")
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(cell)}</td>"
                for cell in (
                    _device_name(device),
                    _num(device["held_seconds"], " s", 1),
                    _num(device["energy_joules"], " J", 1),
                    _num(device["mean_power_watts"], " W"),
                    _num(device["peak_power_watts"], " W"),
                    _num(gfx * 100 if gfx is not None else None, " %", 1),
                    _num(memory * 100 if memory is not None else None, " %", 1),
                    _num(device["peak_temperatures_celsius"].get("junction"), " °C"),
                    _num(device["peak_temperatures_celsius"].get("memory"), " °C"),
                    _gib(device["vram_peak_bytes"]),
                    _pairs(device["throttled_seconds"], " s", 1),
                    _pairs(device["errors"]),
                )
            )
            + "</tr>"
        )
    histories = [(f"gpu {d['gpu']}", d.get("history") or {}) for d in doc["devices"]]

    def series(key: str, scale: float = 1.0) -> list[tuple[str, Sequence[float], Sequence[float | None]]]:
        return [
            (name, h.get("time", []), [None if v is None else v * scale for v in h.get(key, [])])
            for name, h in histories
        ]

    plots = (
        _plot("Power (the job's share of each package)", "W", series("power_watts"))
        + _plot("GFX busy", "%", series("gfx_busy_ratio", 100.0), top=100.0)
        + _plot("Junction temperature", "°C", series("junction_celsius"))
    )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "GPU",
            "Held",
            "Energy",
            "Mean",
            "Peak",
            "GFX busy",
            "Mem busy",
            "Tj max",
            "Tmem max",
            "VRAM peak",
            "Throttled",
            "Errors",
        )
    )
    ended = _when(doc["ended_at"]) if doc["ended_at"] else "now"
    tiles = "".join(
        f'<div class="card {cls}"><span>{esc(name)}</span><b>{esc(value)}</b></div>' for name, value, cls in cards
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Job {esc(doc["job_id"])}: GPU report</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style></head>
<body><header><h1>{esc(doc["scheduler"].capitalize())} job {esc(doc["job_id"])} &middot; {esc(doc["state"])}</h1>
<p>{esc(doc["node"] or "")} &middot; {_when(doc["started_at"])} &rarr; {ended}
{(" &middot; " + esc(labels)) if labels else ""}</p></header>
<main><section class="cards">{tiles}</section>
<section class="plots">{plots}</section>
<table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>
<footer>Energy split: {esc(doc["split_rule"])}. Made by amdgpu-exporter from the daemon's own 1 Hz reads.</footer>
</main></body></html>
"""
