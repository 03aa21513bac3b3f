"""The README's metric reference is generated from the metric table and kept in sync."""

from pathlib import Path

from exporter.exposition.metrics import all_metric_names
from exporter.exposition.metrics_reference import render_reference, replace_reference

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_reference_is_current() -> None:
    text = README.read_text(encoding="utf-8")
    assert replace_reference(text) == text, "run: python -m exporter.exposition.metrics_reference --write"


def test_reference_lists_every_metric() -> None:
    reference = render_reference()
    for name in all_metric_names():
        assert f"`{name}`" in reference
