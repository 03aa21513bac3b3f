"""GET /api/v1/waveform?gpu=N&seconds=S: the fast samples of one device, validated parameters first.

The samples come from the fast sampler's ring (memory only, never hardware). A bad parameter is a
400 with one sentence saying what is wrong; a gpu that is not sampled is a 404.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WaveformReader = Callable[[int, float], dict[str, Any] | None]


@dataclass(frozen=True, slots=True)
class WaveformSource:
    """What the route reads: the sampled gpus, how far back the ring reaches, and the reader."""

    gpus: Callable[[], Sequence[int]]
    max_seconds: float
    read: WaveformReader


class BadRequest(ValueError):
    """A parameter the route cannot serve; the message is the answer's `error`."""


def parse_waveform_query(params: Mapping[str, str], max_seconds: float) -> tuple[int, float]:
    """(gpu, seconds) from the query parameters, or BadRequest naming the parameter."""
    unknown = sorted(set(params) - {"gpu", "seconds"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}: use gpu=N&seconds=S")
    raw_gpu = params.get("gpu")
    if not raw_gpu:
        raise BadRequest("gpu is required: the gpu label of a device, e.g. gpu=0")
    if not (raw_gpu.isascii() and raw_gpu.isdigit()) or len(raw_gpu) > 6:
        raise BadRequest(f"gpu={raw_gpu!r} is not a gpu index (a whole number, e.g. gpu=0)")
    raw_seconds = params.get("seconds", "")
    if raw_seconds == "":
        seconds = max_seconds
    else:
        try:
            if not raw_seconds.isascii():
                raise ValueError(raw_seconds)
            seconds = float(raw_seconds)
        except ValueError:
            raise BadRequest(f"seconds={raw_seconds!r} is not a number (e.g. seconds=5)") from None
        if not math.isfinite(seconds) or seconds <= 0 or seconds > max_seconds:
            raise BadRequest(
                f"seconds={raw_seconds} is out of range: more than 0 and at most {max_seconds:g}"
                " (the --window the fast sampler keeps)"
            )
    return int(raw_gpu), seconds


def waveform_response(source: WaveformSource | None, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    if source is None:
        return 404, {"error": "the fast sampler is off (--fast.interval=0): no waveform is kept"}
    try:
        gpu, seconds = parse_waveform_query(params, source.max_seconds)
    except BadRequest as error:
        return 400, {"error": str(error)}
    wave = source.read(gpu, seconds)
    if wave is None:
        known = ", ".join(str(g) for g in source.gpus()) or "none"
        return 404, {"error": f"no sampled device has gpu={gpu} (sampled: {known})"}
    return 200, wave
