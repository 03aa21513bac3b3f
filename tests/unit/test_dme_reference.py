"""docs/migrating-from-dme.md's mapping and deploy/prometheus/dme-compat.rules.yml are generated from one
table (exporter/exposition/dme_reference.py) and kept in sync with it and with the metric table."""

import re

import yaml

from exporter.exposition.dme_reference import (
    DME_METRICS,
    DOC,
    HARDWARE_SERIES,
    IDENTITY_SERIES,
    RULES,
    render_rules,
    replace_table,
)
from exporter.exposition.metrics import METRICS

FAMILIES = {spec.exposed_name for spec in METRICS}


def test_the_doc_table_is_fresh() -> None:
    doc = DOC.read_text(encoding="utf-8")
    assert replace_table(doc) == doc, "run: python -m exporter.exposition.dme_reference --write"


def test_the_rules_file_is_fresh() -> None:
    stale = "run: python -m exporter.exposition.dme_reference --write"
    assert RULES.read_text(encoding="utf-8") == render_rules(), stale


def test_every_source_reads_families_the_exporter_serves() -> None:
    names = {spec.name for spec in METRICS}
    for metric in DME_METRICS:
        if metric.source is None:
            assert metric.family is None and metric.note, metric.name
            continue
        assert metric.family in names, metric.name
        read = set(re.findall(r"\bamdgpu_[a-z_]+", metric.source))
        assert read and read <= FAMILIES, (metric.name, read - FAMILIES)


def test_one_rule_per_sourced_metric_each_joining_identity_once() -> None:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    records = [rule["record"] for rule in rules]
    assert records[:2] == [HARDWARE_SERIES, IDENTITY_SERIES]
    assert records[2:] == [metric.name for metric in DME_METRICS if metric.source is not None]
    for rule, metric in zip(rules[2:], [m for m in DME_METRICS if m.source is not None], strict=True):
        assert rule["expr"].count("group_left") == (1 if metric.per_gpu else 0), rule["record"]


def test_every_dme_name_in_the_doc() -> None:
    doc = DOC.read_text(encoding="utf-8")
    for metric in DME_METRICS:
        assert f"`{metric.name}`" in doc


def test_the_hardware_labels_every_two_minutes_the_rest_once_a_minute_on_the_identity() -> None:
    """Issue 34: DME's hardware labels renamed every 2 minutes, the identity (with the holders) joined on
    them once a minute, and each other group joins the recorded identity."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    assert [rule["record"] for rule in groups[0]["rules"]] == [HARDWARE_SERIES]
    assert groups[0]["interval"] == "2m"
    assert groups[1]["rules"][0]["record"] == IDENTITY_SERIES
    assert HARDWARE_SERIES in groups[1]["rules"][0]["expr"]
    assert all(group["interval"] == "1m" for group in groups[1:])
    assert len({group["name"] for group in groups}) == len(groups)
    for group in groups[2:]:
        assert all(IDENTITY_SERIES in rule["expr"] for rule in group["rules"]), group["name"]
