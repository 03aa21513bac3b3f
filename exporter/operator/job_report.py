"""`amdgpu-exporter job-report ID`: what a job used, from the daemon's /api/v1/jobs/ID (or from
Prometheus with --prometheus URL), as text, --json, --html (a page with plots) or --record (the
one-line accounting record the Slurm epilog stores in AdminComment)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from exporter.accounting.document import SPLIT_RULE, accounting_record
from exporter.accounting.report import render_html, render_text

DEFAULT_URL = "http://127.0.0.1:9442"
MAX_BYTES = 64 * 1024 * 1024


class ReportError(Exception):
    """One sentence for stderr."""


def _get(url: str, timeout: float) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read(MAX_BYTES))
    except urllib.error.HTTPError as error:
        try:
            body = json.loads(error.read(MAX_BYTES))
        except ValueError:
            body = {}
        return error.code, body
    except (urllib.error.URLError, OSError, TimeoutError) as error:
        reason = getattr(error, "reason", error)
        raise ReportError(f"cannot reach {url}: {reason}") from None
    except ValueError:
        raise ReportError(f"{url} did not answer JSON") from None


def from_daemon(base: str, job_id: str, wait: float, timeout: float = 10.0) -> dict[str, Any]:
    """The job's document; with `wait`, polled until the daemon has seen the job end (the epilog)."""
    url = f"{base.rstrip('/')}/api/v1/jobs/{urllib.parse.quote(job_id, safe='/')}"
    deadline = time.monotonic() + wait
    while True:
        status, body = _get(url, timeout)
        if status == 200 and (body.get("state") == "ended" or time.monotonic() >= deadline):
            return body
        if status == 404 and str(body.get("error", "")).startswith("per-job accounting is off"):
            raise ReportError(body["error"])
        if status not in (200, 404):
            raise ReportError(f"{url} answered {status}: {body.get('error', '')}".rstrip(": "))
        if status == 404 and time.monotonic() >= deadline:
            raise ReportError(body.get("error") or f"{url} answered 404")
        time.sleep(0.5)


def _query_range(base: str, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    status, body = _get(f"{base.rstrip('/')}/api/v1/query_range?{params}", 30.0)
    if status != 200 or body.get("status") != "success":
        raise ReportError(f"Prometheus refused {query!r}: {body.get('error', status)}")
    return list(body["data"]["result"])


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def from_prometheus(base: str, job_id: str, since: float, now: float | None = None) -> dict[str, Any]:
    """The job's document from Prometheus: the daemon's per-job counters (the same split) while it ran,
    and its GPUs' power, gfx busy and junction temperature over its lifetime (socket-wide figures
    of a partition or die 1 are its package lead's)."""
    end = time.time() if now is None else now
    start = end - since
    step = max(1.0, since / 2000)
    selector = f'job_id="{_escape(job_id)}"'
    info = _query_range(base, f"amdgpu_job_info{{{selector}}}", start, end, step)
    if not info:
        raise ReportError(f"Prometheus has no amdgpu_job_info for job {job_id} in the last {since:g} s")
    instance = info[0]["metric"].get("instance", "")
    gpus = sorted({int(r["metric"]["gpu"]) for r in info})
    times = [float(t) for r in info for t, _ in r["values"]]
    first, last = min(times), max(times)
    where = f'instance="{_escape(instance)}",gpu=~"{"|".join(map(str, gpus))}"'

    def last_value(query: str) -> float:
        result = _query_range(base, query, first, last, step)
        return max((float(v) for r in result for _, v in r["values"]), default=0.0)

    energy = last_value(f"amdgpu_job_energy_joules_total{{{selector}}}")
    gpu_seconds = last_value(f"amdgpu_job_gpu_seconds_total{{{selector}}}") or (last - first) * len(gpus)

    def per_gpu(query: str) -> dict[int, list[tuple[float, float]]]:
        return {
            int(r["metric"]["gpu"]): [(float(t), float(v)) for t, v in r["values"]]
            for r in _query_range(base, query, first, last, step)
        }

    power = per_gpu(f"amdgpu_power_watts{{{where}}}")
    busy = per_gpu(f'amdgpu_busy_ratio{{{where},engine="gfx"}}')
    junction = per_gpu(f'amdgpu_temperature_celsius{{{where},sensor="junction"}}')
    vram = per_gpu(f'amdgpu_memory_used_bytes{{{where},pool="vram"}}')
    devices: list[dict[str, Any]] = []
    for gpu in gpus:
        stamps = sorted({t for series in (power, busy, junction) for t, _ in series.get(gpu, [])})
        columns = [dict(series.get(gpu, [])) for series in (power, busy, junction)]
        gfx = [v for _, v in busy.get(gpu, [])]
        peak_tj = max((v for _, v in junction.get(gpu, [])), default=None)
        held = gpu_seconds / len(gpus)
        devices.append(
            {
                "gpu": gpu,
                "product": "",
                "package": "",
                "die": 0,
                "partition": 0,
                "held_seconds": held,
                "energy_joules": energy / len(gpus),
                "mean_power_watts": energy / len(gpus) / held if held else None,
                "peak_power_watts": max((v for _, v in power.get(gpu, [])), default=None),
                "busy_seconds": {"gfx": sum(gfx) / len(gfx) * held} if gfx else {},
                "mean_busy_ratio": {"gfx": sum(gfx) / len(gfx)} if gfx else {},
                "peak_temperatures_celsius": {"junction": peak_tj} if peak_tj is not None else {},
                "vram_peak_bytes": max((v for _, v in vram.get(gpu, [])), default=None),
                "throttled_seconds": {},
                "errors": {},
                "failed_checks": [],
                "history": {
                    "time": stamps,
                    "power_watts": [columns[0].get(t) for t in stamps],
                    "gfx_busy_ratio": [columns[1].get(t) for t in stamps],
                    "junction_celsius": [columns[2].get(t) for t in stamps],
                },
            }
        )
    labels = {k: v for k, v in info[0]["metric"].items() if k in ("job_id", "job_user", "job_partition")}
    ended = last < end - 2 * step
    tjs = [d["peak_temperatures_celsius"]["junction"] for d in devices if d["peak_temperatures_celsius"]]
    vrams = [d["vram_peak_bytes"] for d in devices if d["vram_peak_bytes"] is not None]
    return {
        "job_id": job_id,
        "scheduler": "slurm",
        "state": "ended" if ended else "running",
        "node": instance,
        "labels": labels,
        "started_at": first,
        "ended_at": last if ended else None,
        "updated_at": last,
        "duration_seconds": last - first,
        "gpus": gpus,
        "totals": {
            "energy_joules": energy,
            "gpu_seconds": gpu_seconds,
            "gpu_hours": gpu_seconds / 3600,
            "mean_power_watts": energy / (last - first) if last > first else None,
            "peak_device_power_watts": None,
            "busy_seconds": {"gfx": sum(d["busy_seconds"].get("gfx", 0.0) for d in devices)},
            "peak_temperatures_celsius": {"junction": max(tjs)} if tjs else {},
            "vram_peak_bytes": max(vrams) if vrams else None,
            "throttled_seconds": {},
            "errors": {},
            "failed_checks": [],
        },
        "split_rule": SPLIT_RULE + " (from Prometheus: the daemon's per-job counters, at the scrape interval)",
        "devices": devices,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amdgpu-exporter job-report",
        description="What a job or pod used of this node's GPUs: energy, GPU time, busy, peaks, errors.",
    )
    parser.add_argument("job_id", metavar="ID", help="the Slurm/Flux/PBS job id, or a pod's namespace/name")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print the /api/v1/jobs/ID document")
    shape.add_argument("--html", action="store_true", help="print one self-contained HTML page with plots")
    shape.add_argument("--record", action="store_true", help="print the one-line accounting record")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"the daemon to ask (default {DEFAULT_URL})")
    parser.add_argument("--prometheus", metavar="URL", help="build the report from this Prometheus instead")
    parser.add_argument(
        "--since", type=float, default=86400.0, metavar="SECONDS", help="with --prometheus: how far back to look"
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the daemon to see the job end (an epilog's report)",
    )
    return parser


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    if not 0 <= args.wait <= 600 or not 60 <= args.since <= 90 * 86400:
        print("amdgpu-exporter: error: --wait is 0..600 s and --since 60 s..90 d", file=sys.stderr)
        return 2
    try:
        if args.prometheus:
            document = from_prometheus(args.prometheus, args.job_id, args.since)
        else:
            document = from_daemon(args.url, args.job_id, args.wait)
    except ReportError as error:
        print(f"amdgpu-exporter: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        out = json.dumps(document, indent=2) + "\n"
    elif args.html:
        out = render_html(document)
    elif args.record:
        out = accounting_record(document) + "\n"
    else:
        out = render_text(document)
    sys.stdout.write(out)
    return 0
