"""/api/v1/waveform parameter checks, answered as data (the route only serialises them)."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.web.waveform import WaveformSource, waveform_response


def reader(gpu: int, seconds: float) -> dict[str, Any] | None:
    return {"gpu": gpu, "seconds": seconds} if gpu in (0, 1) else None


SOURCE = WaveformSource(gpus=lambda: [0, 1], max_seconds=15.0, read=reader)


def test_a_good_request_reads_the_ring() -> None:
    assert waveform_response(SOURCE, {"gpu": "1", "seconds": "2.5"}) == (200, {"gpu": 1, "seconds": 2.5})


def test_seconds_default_to_the_whole_window() -> None:
    assert waveform_response(SOURCE, {"gpu": "0"}) == (200, {"gpu": 0, "seconds": 15.0})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "gpu is required"),
        ({"gpu": ""}, "gpu is required"),
        ({"gpu": "-1"}, "gpu='-1' is not a gpu index"),
        ({"gpu": "zero"}, "is not a gpu index"),
        ({"gpu": "1.5"}, "is not a gpu index"),
        ({"gpu": "0", "seconds": "abc"}, "seconds='abc' is not a number"),
        ({"gpu": "0", "seconds": "0"}, "seconds=0 is out of range: more than 0 and at most 15"),
        ({"gpu": "0", "seconds": "-3"}, "out of range"),
        ({"gpu": "0", "seconds": "16"}, "at most 15"),
        ({"gpu": "0", "seconds": "nan"}, "out of range"),
        ({"gpu": "0", "seconds": "inf"}, "out of range"),
        ({"gpu": "0", "sec": "1"}, "unknown parameter 'sec'"),
    ],
)
def test_bad_parameters_are_a_400_naming_the_parameter(params: dict[str, str], message: str) -> None:
    status, body = waveform_response(SOURCE, params)
    assert status == 400
    assert message in body["error"]
    assert "\n" not in body["error"]


def test_an_unsampled_gpu_is_a_404_listing_the_sampled_ones() -> None:
    assert waveform_response(SOURCE, {"gpu": "7"}) == (404, {"error": "no sampled device has gpu=7 (sampled: 0, 1)"})


def test_no_fast_sampler_is_a_404_saying_why() -> None:
    status, body = waveform_response(None, {"gpu": "0"})
    assert status == 404
    assert "--fast.interval=0" in body["error"]
