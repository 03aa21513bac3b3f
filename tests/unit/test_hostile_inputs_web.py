"""Issue 31 at the unit level: POST /metrics renders nothing; JSON and label text that no reader cleaned
(a lone surrogate) never fails an answer; a selection of thousands of unknown globs says a bounded amount."""

from __future__ import annotations

import math

from starlette.testclient import TestClient

from exporter.attribution.slurm import parse_state_file
from exporter.attribution.text import clean_labels, clean_text
from exporter.cycle import PublishedState
from exporter.exposition.selection import MAX_PATTERNS, MAX_PROBLEMS_SHOWN, Selection
from exporter.pipeline.readiness import Readiness
from exporter.web.routes import create_app, json_bytes
from tests.unit.test_exposition import _snapshot


class BrokenRender:
    """RenderedMetrics whose rendering fails (a bug, or text no encoder takes)."""

    renders = 0

    def cached(self, openmetrics: bool, gzipped: bool) -> bytes | None:
        return None

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        BrokenRender.renders += 1
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")


def test_post_metrics_is_refused_before_rendering_and_leaves_readiness_alone() -> None:
    readiness = Readiness(interval=math.inf)
    state = PublishedState(source="sysfs", published=_snapshot(), metrics=BrokenRender())  # type: ignore[arg-type]
    client = TestClient(create_app(lambda: state, "/metrics", readiness))
    for method in ("POST", "PUT", "DELETE"):
        response = client.request(method, "/metrics", content=b"x" * 1000)
        assert response.status_code == 405 and response.headers["allow"] == "GET, HEAD"
    assert BrokenRender.renders == 0
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 500  # a GET does render, and says so
    assert client.get("/readyz").status_code == 503


def test_a_lone_surrogate_in_a_state_file_becomes_the_replacement_character() -> None:
    data = b'{"SLURM_JOB_ID":"42","SLURM_JOB_USER":"\\ud800x","SLURM_JOB_PARTITION":"\\udc80"}'
    claim = parse_state_file("0.42", data)
    assert claim is not None
    assert dict(claim.labels) == {"job_id": "42", "job_user": "\ufffdx", "job_partition": "\ufffd"}
    # a surrogate pair escape is one character, kept
    claim = parse_state_file("0.42", b'{"SLURM_JOB_ID":"42","SLURM_JOB_USER":"\\ud83d\\ude00"}')
    assert claim is not None and dict(claim.labels)["job_user"] == "\U0001f600"


def test_clean_text_keeps_ordinary_text_and_replaces_only_lone_surrogates() -> None:
    assert clean_text("alice") == "alice" and clean_text("jörg 训练") == "jörg 训练"
    assert clean_text("a\ud800b\udfff") == "a\ufffdb\ufffd"
    labels = (("pod", "p"), ("namespace", "n"))
    assert clean_labels(labels) is labels
    assert clean_labels((("pod", "\ud800"),)) == (("pod", "\ufffd"),)


def test_json_documents_encode_text_no_reader_cleaned() -> None:
    assert json_bytes({"user": "\ud800", "name": "jörg"}) == '{"user":"?","name":"jörg"}'.encode()
    assert json_bytes(None) is None


def test_thousands_of_globs_that_match_nothing_get_a_bounded_answer() -> None:
    selection = Selection(families_include=tuple(f"nothing_{n}_*" for n in range(2000)))
    problems = selection.problems()
    assert len(problems) == MAX_PROBLEMS_SHOWN + 1
    assert problems[-1] == "and 1990 more name(s) or glob(s) that match nothing"
    assert Selection(families_exclude=("amdgpu_tempreature_celsius",) * 3).problems() == [
        "families.exclude: 'amdgpu_tempreature_celsius' matches no family; did you mean amdgpu_temperature_celsius?"
    ]


def test_a_list_of_more_globs_than_the_cap_is_refused_before_any_matching() -> None:
    selection = Selection(families_include=tuple(f"amdgpu_*[!{n}]" for n in range(30_000)))
    (problem,) = selection.problems()
    assert problem.startswith(f"families.include: lists 30000 names or globs; at most {MAX_PATTERNS} (there are ")
