"""docs/api.md's table of the devices document's `sample` fields is generated (api_reference.py): it
is current, it names every field the document carries, and a field no hand row describes is described
by the metric family made of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporter.exposition.api_reference import API_MD, ROWS, derived_row, json_type, replace_table, rows
from exporter.exposition.views import device_json
from exporter.model import DeviceIdentity, DeviceState, Sample


def test_api_md_sample_table_is_current() -> None:
    text = API_MD.read_text(encoding="utf-8")
    assert replace_table(text) == text, "run: python -m exporter.exposition.metrics_reference --write"


def test_the_table_names_every_key_of_a_sample_document() -> None:
    state = DeviceState(
        identity=DeviceIdentity(pci_bus_id="0000:03:00.0", card="card0", device_dir="/sys/devices/x"),
        gpu=0,
        up=True,
        sample=Sample(timestamp=1.0),
    )
    document = device_json(state, now=2.0)
    named = {name for names, _kind, _meaning in rows() for name in names}
    assert set(document["sample"]) == named


def test_a_field_shown_by_a_family_is_described_by_its_help() -> None:
    field = {f.name: f for f in dataclasses.fields(Sample)}["clocks_hertz"]
    (name,), kind, meaning = derived_row(field)
    assert (name, kind) == ("clocks_hertz", "object")
    assert meaning.startswith("`domain` -> `amdgpu_clock_hertz`: Current clock by domain")


def test_a_field_no_family_shows_must_be_described_by_hand() -> None:
    field = {f.name: f for f in dataclasses.fields(Sample)}["timestamp"]
    assert any("timestamp" in names for names, _kind, _meaning in ROWS)
    with pytest.raises(ValueError, match=r"Sample.timestamp is shown by no metric family"):
        derived_row(field)


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("float | None", "number or null"),
        ("int | None", "integer or null"),
        ("bool | None", "boolean or null"),
        ("Mapping[str, float]", "object"),
        ("tuple[float, ...] | None", "array or null"),
        ("float", "number"),
    ],
)
def test_json_types(annotation: str, expected: str) -> None:
    assert json_type(annotation) == expected


def test_the_generated_table_is_in_docs_api_md() -> None:
    assert Path(API_MD).name == "api.md" and "<!-- sample-fields:begin" in API_MD.read_text(encoding="utf-8")
