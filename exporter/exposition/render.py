"""Published -> /metrics bytes: every chosen family of the metric table, written straight to text, at
most once per format.

A scrape then only sends bytes: its cost does not depend on how many GPUs there are or whether
one of them is hung (see docs/architecture.md). Text, OpenMetrics and their gzip forms are made
here, by the first scrape that asks for one after a cycle, so the HTTP layer never formats anything.

One path, from the metric table to the bytes: no intermediate objects. prometheus-client is the
reference, not a stage: tests/unit/test_render_format.py asserts that these bytes are the library's
own (generate_latest of the same families, both formats, any label value and number). The library's
formatter on its own objects costs ~3x this whole path on a 16-GCD node (measured in
bench/RESULTS.md), more than node_exporter spends on a whole scrape, which is why it is not used.
"""

from __future__ import annotations

import gzip
import math
import operator
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from exporter.exposition.metrics import METRICS, LabelledValue, MetricSpec
from exporter.exposition.selection import DEFAULT_WINDOW_SERIES, DEFAULTS, ExpositionOptions
from exporter.log import get_logger
from exporter.model import IDENTITY_FIELDS, DeviceIdentity, Histogram, Published

log = get_logger("exporter.exposition")


class RenderedMetrics:
    """The /metrics bytes of one snapshot, rendered at most once per format, on first request.

    Prometheus scrapes every 15-60 s while the poller produces a snapshot every second:
    rendering every cycle eagerly (text and OpenMetrics, ~2,000 series) would spend most of the
    exporter's CPU on bytes nobody reads. A snapshot is rendered when the first scrape after it
    asks for a format, and every later scrape of that snapshot gets the same bytes.
    """

    def __init__(self, published: Published, options: ExpositionOptions = DEFAULTS) -> None:
        self._published = published  # immutable, so two cycles can be rendered on different threads
        self._options = options
        self._lock = threading.Lock()
        self._cache: dict[tuple[bool, bool], bytes] = {}

    def cached(self, openmetrics: bool, gzipped: bool) -> bytes | None:
        return self._cache.get((openmetrics, gzipped))

    def body(self, openmetrics: bool, gzipped: bool) -> bytes:
        """The bytes for a format; renders them (blocking, milliseconds) if nobody has yet."""
        key = (openmetrics, gzipped)
        found = self._cache.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                return found
            plain = self._cache.get((openmetrics, False))
            if plain is None:
                plain = exposition(self._published, self._options, openmetrics)
                self._cache[(openmetrics, False)] = plain
            if gzipped:
                # Level 5: most of the size win at a fraction of level 9's CPU.
                self._cache[key] = gzip.compress(plain, compresslevel=5, mtime=0)
            return self._cache[key]

    @property
    def text(self) -> bytes:
        return self.body(False, False)

    @property
    def openmetrics(self) -> bytes:
        return self.body(True, False)


def render(published: Published, options: ExpositionOptions = DEFAULTS) -> RenderedMetrics:
    """Cheap: the bytes are made on first request (RenderedMetrics)."""
    return RenderedMetrics(published, options)


def exposition(published: Published, options: ExpositionOptions, openmetrics: bool) -> bytes:
    """The chosen families of one Published: the Prometheus text format, or OpenMetrics (ending in `# EOF`).

    A family whose making fails is left out and its collector's amdgpu_exporter_collector_success is
    0 (the log says which family and why); every other family is still served.
    """
    out: list[str] = []
    outcomes: dict[str, tuple[bool, float]] = {}  # collector -> (no family failed, seconds)
    identities = {str(state.gpu): state.identity for state in published.snapshot.devices}
    by_gpu: dict[tuple[str, tuple[str, ...], bool], tuple[str, ...]] = {}
    for spec in METRICS:
        if spec.name not in options.families:
            continue
        if spec.outcome is not None:
            rows = list(spec.outcome(dict(sorted(outcomes.items()))))
            out.append(header(spec.name, spec.help, spec.kind, openmetrics) + family_lines(spec, spec.labels, rows))
            continue
        started = time.perf_counter()
        text: str | None = None
        try:
            text = family_text(_family_rows(spec, published, options, identities, by_gpu), openmetrics)
        except Exception as error:  # one broken family must not take /metrics down with it
            log.warning("family_failed", family=spec.name, collector=spec.collector, error=repr(error))
        ok, seconds = outcomes.get(spec.collector, (True, 0.0))
        outcomes[spec.collector] = (ok and text is not None, seconds + time.perf_counter() - started)
        if text:
            out.append(text)
    if openmetrics:
        out.append("# EOF\n")
    # "replace": a label value no reader cleaned (a lone surrogate) costs one "?", never the scrape
    return "".join(out).encode("utf-8", "replace")


Family = tuple[MetricSpec, tuple[str, ...], Iterable[LabelledValue] | Histogram]


def family_text(family: Family, openmetrics: bool) -> str:
    """One family's header and lines ("" for an empty family the table omits when empty)."""
    spec, label_names, rows = family
    if isinstance(rows, Histogram):
        return histogram_lines(spec.name, spec.help, rows, openmetrics)
    lines = family_lines(spec, label_names, rows)
    if lines or not spec.omit_when_empty:
        return header(spec.name, spec.help, spec.kind, openmetrics) + lines
    return ""


def chosen_families(published: Published, options: ExpositionOptions = DEFAULTS) -> Iterator[Family]:
    """(spec, label names, series or histogram) of every chosen family of the metric table, in table
    order (the collectors' outcome families, made by exposition itself, left out)."""
    identities = {str(state.gpu): state.identity for state in published.snapshot.devices}
    by_gpu: dict[tuple[str, tuple[str, ...], bool], tuple[str, ...]] = {}
    for spec in METRICS:
        if spec.name in options.families and spec.outcome is None:
            yield _family_rows(spec, published, options, identities, by_gpu)


def _family_rows(
    spec: MetricSpec,
    published: Published,
    options: ExpositionOptions,
    identities: Mapping[str, DeviceIdentity],
    by_gpu: dict[tuple[str, tuple[str, ...], bool], tuple[str, ...]],
) -> Family:
    """One family's label names and series (`by_gpu`: the extra labels of each GPU, filled as met).

    A window family renders the series of DEFAULT_WINDOW_SERIES only, unless all are asked for. Every
    per-GPU family (first label `gpu`) also carries the chosen identity labels it does not have
    itself (--metrics.identity-labels), then, with attribution on and asked for on every series
    (--attribution.series-labels), the attribution labels: with the values of the snapshot they are
    rendered from ("" for a device nobody holds or not known).
    """
    if spec.kind == "histogram":
        assert spec.histogram is not None
        return spec, (), spec.histogram(published)
    attribution = published.snapshot.attribution
    per_gpu = spec.labels[:1] == ("gpu",)
    identity = tuple(name for name in options.identity_labels if name not in spec.labels) if per_gpu else ()
    attributed = options.attribution_labels and bool(attribution.label_names) and spec.attributed and per_gpu
    window_series = None if options.all_window_series else DEFAULT_WINDOW_SERIES.get(spec.name)
    extra = (*identity, *(attribution.label_names if attributed else ()))
    rows: Iterable[LabelledValue] = spec.values(published)
    if window_series is not None:
        rows = [(labels, value) for labels, value in rows if labels[1:] in window_series]
    if extra:
        with_extra = []
        for labels, value in rows:
            key = (labels[0], identity, attributed)
            if key not in by_gpu:
                found = identities.get(labels[0])
                shown = tuple(str(getattr(found, IDENTITY_FIELDS[name])) if found else "" for name in identity)
                by_gpu[key] = (*shown, *(attribution.values_for(int(labels[0])) if attributed else ()))
            with_extra.append(((*labels, *by_gpu[key]), value))
        rows = with_extra
    return spec, (*spec.labels, *extra), rows


# --- the formats: prometheus-client's bytes (tests/unit/test_render_format.py holds them to it) ----


def header(name: str, help_text: str, kind: str, openmetrics: bool) -> str:
    """# HELP and # TYPE of a family; a counter is named with `_total` in the text format only."""
    if openmetrics:
        return f"# HELP {name} {_escape(help_text)}\n# TYPE {name} {kind}\n"
    shown = name + "_total" if kind == "counter" else name
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")  # no quote escaping in the text format
    return f"# HELP {shown} {escaped}\n# TYPE {shown} {kind}\n"


def family_lines(spec: MetricSpec, label_names: Sequence[str], rows: Iterable[LabelledValue]) -> str:
    """One line per series (the same in both formats): labels sorted by name, as the library writes them."""
    name = spec.name + "_total" if spec.kind == "counter" else spec.name
    if not label_names:
        return "".join(f"{name} {go_float(value)}\n" for _, value in rows)
    order = sorted(range(len(label_names)), key=label_names.__getitem__)
    # Names are [a-zA-Z0-9_:] (the metric table's test holds them to it): no "%" to escape in the template.
    template = name + "{" + ",".join(f'{label_names[index]}="%s"' for index in order) + "} %s\n"
    pick = operator.itemgetter(*order) if len(order) > 1 else lambda labels: (labels[order[0]],)
    numbers: dict[float, str] = {}
    lines = []
    for labels, value in rows:
        shown = pick(labels)
        joined = "".join(shown)
        if "\\" in joined or "\n" in joined or '"' in joined:
            shown = tuple(_escape(text) for text in shown)
        number = numbers.get(value) if value else None  # 0.0 and -0.0 are one key, not one text
        if number is None:
            number = numbers[value] = go_float(value)
        lines.append(template % (*shown, number))
    return "".join(lines)


def histogram_lines(name: str, help_text: str, histogram: Histogram, openmetrics: bool) -> str:
    """A label-less histogram: cumulative buckets (le as Go writes floats), then _count and _sum; no _created."""
    lines = [header(name, help_text, "histogram", openmetrics)]
    cumulative = 0
    for bound, count in zip((*histogram.bounds, math.inf), histogram.counts, strict=True):
        cumulative += count
        lines.append(f'{name}_bucket{{le="{go_float(bound)}"}} {go_float(cumulative)}\n')
    lines.append(f"{name}_count {go_float(cumulative)}\n{name}_sum {go_float(histogram.total)}\n")
    return "".join(lines)


def _escape(text: str) -> str:
    if "\\" in text or "\n" in text or '"' in text:
        return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return text


def go_float(value: float) -> str:
    """A number as Prometheus (Go) writes it: +Inf, -Inf, NaN, and exponents from 1e+07 up."""
    number = float(value)
    text = repr(number)
    if number > 0:
        if number == math.inf:
            return "+Inf"
        dot = text.find(".")
        if dot > 6:  # Go switches to exponents sooner than Python
            mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
            return f"{mantissa}e+{dot - 1:02d}"
        return text
    if number == -math.inf:
        return "-Inf"
    if number != number:
        return "NaN"
    return text
