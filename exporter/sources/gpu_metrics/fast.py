"""Field-subset extractor for gpu_metrics: the few values a sub-second sampler needs, nothing else.

The full decoder (gpu_metrics.py) builds a GpuMetrics of ~40 fields; sampling 16 GCDs ten times a
second needs only temperatures, power, busy, clocks and the accumulators behind exact means. For
each layout this module generates, once, a function that unpacks exactly those fields with one
precompiled struct call (everything else skipped as pad bytes) and returns a flat tuple of floats
in CHANNELS order, NaN where the device does not supply a value. Same unit rules and all-ones
convention as the full decoder (tests hold the two to each other on random tables).

v1.9 tables are self-describing, so their extractor is compiled from the record list of the first
table seen and checked on every later table: one struct call reads every record's encoding along
with the values, and a table whose encodings differ (a firmware update) is compiled afresh.

A pure function over bytes: no I/O, raises FastExtractError (and nothing else) on a bad table.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter.sources.gpu_metrics.decoder import ENERGY_JOULES_PER_TICK
from exporter.sources.gpu_metrics.layouts import (
    ATTR_ID_MASK,
    ATTR_ID_SHIFT,
    ATTR_INSTANCES_MASK,
    ATTR_NAMES,
    ATTR_TYPE_FORMAT,
    ATTR_TYPE_MASK,
    ATTR_TYPE_SHIFT,
    ATTR_UNIT_MASK,
    ATTR_UNIT_SHIFT,
    C_TYPES,
    FIXED_FIELD_UNITS,
    FIXED_LAYOUTS,
    HEADER,
    HEADER_SIZE,
    SIGNED_ATTR_TYPES,
    V1_9_CONTENT_REVISION,
    V1_9_ENCODING,
    V1_9_FIXED,
    V1_9_FORMAT_REVISION,
    AttrType,
    AttrUnit,
    Layout,
)

NAN = math.nan

# What the fast sampler records, as (family, key): families are those of the window metrics, keys
# their label values (sensor, engine, domain). Accumulators are family "acc".
CHANNELS: tuple[tuple[str, str], ...] = (
    ("temperature", "edge"),
    ("temperature", "junction"),
    ("temperature", "memory"),
    ("temperature", "vr_gfx"),
    ("temperature", "vr_soc"),
    ("temperature", "vr_mem"),
    ("temperature", "hbm0"),
    ("temperature", "hbm1"),
    ("temperature", "hbm2"),
    ("temperature", "hbm3"),
    ("power", "socket"),
    ("busy", "gfx"),
    ("busy", "memory"),
    ("clock", "gfx"),
    ("clock", "memory"),
    ("clock", "soc"),
    ("acc", "energy_joules"),  # 2^-16 J ticks x 2^-16
    ("acc", "gfx_activity"),  # accumulated %·s (MI300-class only, see ACTIVITY_ACCUMULATOR_FIRST)
    ("acc", "mem_activity"),
    ("acc", "clock_seconds"),  # system_clock_counter: the time base of the accumulators
)
CHANNEL_INDEX = {channel: index for index, channel in enumerate(CHANNELS)}

# The activity accumulators are used from the MI300 tables on (v1_4+); MI200 tables carry the
# fields too but their firmware's accumulation is not documented, so MI200 means come from samples.
ACTIVITY_ACCUMULATOR_FIRST = (1, 4)

_TEMPERATURE_FIELDS = (
    ("edge", "temperature_edge"),
    ("junction", "temperature_hotspot"),
    ("memory", "temperature_mem"),
    ("vr_gfx", "temperature_vrgfx"),
    ("vr_soc", "temperature_vrsoc"),
    ("vr_mem", "temperature_vrmem"),
)
_CLOCK_FIELDS = (("gfx", "current_gfxclk"), ("memory", "current_uclk"), ("soc", "current_socclk"))

# What one stored unit is worth, per kind; a field stored in another unit is not supplied.
_CELSIUS = {AttrUnit.TEMP_CELSIUS: 1.0}
_WATTS = {AttrUnit.POWER_WATT: 1.0}
_HERTZ = {AttrUnit.CLOCK_MHZ: 1e6}
_SECONDS = {AttrUnit.TIME_NS: 1e-9, AttrUnit.TIME_10NS: 1e-8}
_TICKS = {AttrUnit.NONE: ENERGY_JOULES_PER_TICK}
_PERCENT = {AttrUnit.PERCENT: 1.0}
_RAW: dict[AttrUnit, float] | None = None  # no unit check (the full decoder reads accumulators raw)
_TYPE_CODES = frozenset(t.value for t in AttrType)


class FastExtractError(ValueError):
    """The blob is not a gpu_metrics table the extractor can read; the message says why."""


@dataclass(frozen=True, slots=True)
class _Stored:
    """Where one kernel field's elements sit in the unpacked tuple, and how they are stored."""

    first: int  # index of element 0 in the flat tuple
    count: int
    all_ones: int
    signed_half: int  # 0 for unsigned types, else 1 << (bits - 1)
    unit: int  # AttrUnit code the field is stored in


Extract = Callable[[bytes], tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class Extractor:
    """One compiled layout: `extract(blob)` -> CHANNELS-ordered floats, NaN = not supplied."""

    name: str
    size: int
    extract: Extract
    source: str  # the generated code, kept for tests and for anyone debugging a layout
    encodings: tuple[int, ...] = ()  # v1.9: the record encodings this extractor was compiled for


def _scale(stored: _Stored, kind: dict[AttrUnit, float] | None) -> float | None:
    if kind is None:
        return 1.0
    try:
        return kind.get(AttrUnit(stored.unit))
    except ValueError:
        return None


class _Generator:
    """Builds the source of one extractor: an expression per channel over the unpacked tuple `v`."""

    def __init__(self, fields: dict[str, _Stored], version: tuple[int, int]) -> None:
        self.fields = fields
        self.version = version

    def element(self, stored: _Stored, index: int, factor: float) -> str:
        item = f"v[{stored.first + index}]"
        value = f"_signed({item}, {stored.signed_half})" if stored.signed_half else item
        scaled = value if factor == 1.0 else f"{value} * {factor!r}"
        return f"(_nan if {item} == {stored.all_ones} else {scaled})"

    def scalar(self, name: str, kind: dict[AttrUnit, float] | None, index: int = 0) -> str | None:
        stored = self.fields.get(name)
        if stored is None or index >= stored.count:
            return None
        factor = _scale(stored, kind)
        return None if factor is None else self.element(stored, index, factor)

    def ratio(self, name: str) -> str | None:
        stored = self.fields.get(name)
        if stored is None or _scale(stored, _PERCENT) is None:
            return None
        if stored.count > 1:  # the first element that is a utilisation, as the full decoder takes
            items = ", ".join(f"v[{stored.first + i}]" for i in range(stored.count))
            return f"_first_ratio(({items}), {stored.all_ones}, {stored.signed_half})"
        item = f"v[{stored.first}]"
        value = f"_signed({item}, {stored.signed_half})" if stored.signed_half else item
        # Divide by 100 (exact for whole percents); outside 0..100 % is not a utilisation: dropped.
        return f"_ratio({value}, {stored.all_ones}, {item})"

    def highest(self, name: str, kind: dict[AttrUnit, float]) -> str | None:
        stored = self.fields.get(name)
        if stored is None:
            return None
        factor = _scale(stored, kind)
        if factor is None:
            return None
        if stored.count == 1:
            return self.element(stored, 0, factor)
        items = ", ".join(f"v[{stored.first + i}]" for i in range(stored.count))
        return f"_highest(({items}), {stored.all_ones}, {stored.signed_half}, {factor!r})"

    def channels(self) -> list[str]:
        expressions: dict[tuple[str, str], str | None] = {}
        for sensor, name in _TEMPERATURE_FIELDS:
            expressions[("temperature", sensor)] = self.scalar(name, _CELSIUS)
        for index in range(4):
            expressions[("temperature", f"hbm{index}")] = self.scalar("temperature_hbm", _CELSIUS, index)
        current = self.scalar("curr_socket_power", _WATTS)
        average = self.scalar("average_socket_power", _WATTS)
        if current is not None and average is not None:
            expressions[("power", "socket")] = f"_first({current}, {average})"
        else:
            expressions[("power", "socket")] = current or average
        expressions[("busy", "gfx")] = self.ratio("average_gfx_activity")
        expressions[("busy", "memory")] = self.ratio("average_umc_activity")
        for domain, name in _CLOCK_FIELDS:
            expressions[("clock", domain)] = self.highest(name, _HERTZ)
        expressions[("acc", "energy_joules")] = self.scalar("energy_accumulator", _TICKS)
        if self.version >= ACTIVITY_ACCUMULATOR_FIRST:
            expressions[("acc", "gfx_activity")] = self.scalar("gfx_activity_acc", _RAW)
            expressions[("acc", "mem_activity")] = self.scalar("mem_activity_acc", _RAW)
        expressions[("acc", "clock_seconds")] = self.scalar("system_clock_counter", _SECONDS)
        return [expressions.get(channel) or "_nan" for channel in CHANNELS]


def _signed(value: int, half: int) -> int:
    return value - 2 * half if value >= half else value


def _ratio(value: int, all_ones: int, stored: int) -> float:
    if stored == all_ones or not 0 <= value <= 100:
        return NAN
    return value / 100


def _first_ratio(items: Sequence[int], all_ones: int, half: int) -> float:
    for stored in items:
        ratio = _ratio(_signed(stored, half) if half else stored, all_ones, stored)
        if ratio == ratio:
            return ratio
    return NAN


def _first(a: float, b: float) -> float:
    return b if a != a else a  # NaN is the only value unequal to itself


def _highest(items: Sequence[int], all_ones: int, half: int, factor: float) -> float:
    supplied = [(_signed(v, half) if half else v) for v in items if v != all_ones]
    return max(supplied) * factor if supplied else NAN


_HELPERS = {
    "_nan": NAN,
    "_signed": _signed,
    "_ratio": _ratio,
    "_first_ratio": _first_ratio,
    "_first": _first,
    "_highest": _highest,
}


def _generate(
    name: str, codec: struct.Struct, fields: dict[str, _Stored], version: tuple[int, int]
) -> tuple[Extract, str]:
    body = ",\n        ".join(_Generator(fields, version).channels())
    source = f"def extract(data, _unpack=_unpack):\n    v = _unpack(data)\n    return (\n        {body},\n    )\n"
    namespace: dict[str, object] = {**_HELPERS, "_unpack": codec.unpack_from}
    # The code is generated from the layout tables and the record encodings alone (integers), never
    # from text read off a device: one flat function per layout is what makes a read this cheap.
    exec(compile(source, f"<gpu_metrics fast extractor {name}>", "exec"), namespace)
    return namespace["extract"], source  # type: ignore[return-value]


def _wanted_fields() -> frozenset[str]:
    names = {name for _, name in _TEMPERATURE_FIELDS} | {name for _, name in _CLOCK_FIELDS}
    names |= {
        "temperature_hbm",
        "curr_socket_power",
        "average_socket_power",
        "average_gfx_activity",
        "average_umc_activity",
        "energy_accumulator",
        "gfx_activity_acc",
        "mem_activity_acc",
        "system_clock_counter",
    }
    return frozenset(names)


WANTED_FIELDS = _wanted_fields()


def compile_fixed(layout: Layout) -> Extractor:
    """The extractor of one fixed layout: one struct over the wanted fields, the rest skipped."""
    wanted = sorted((f for f in layout.fields if f.name in WANTED_FIELDS), key=lambda f: f.offset)
    parts = ["<"]
    position = 0
    stored: dict[str, _Stored] = {}
    flat = 0
    for fld in wanted:
        code, width, _ = C_TYPES[fld.ctype]
        if fld.offset > position:
            parts.append(f"{fld.offset - position}x")
        parts.append(f"{fld.count}{code}")
        position = fld.offset + fld.size
        unit = FIXED_FIELD_UNITS.get(fld.name, AttrUnit.NONE)
        stored[fld.name] = _Stored(flat, fld.count, (1 << (8 * width)) - 1, 0, int(unit))
        flat += fld.count
    codec = struct.Struct("".join(parts))  # no trailing pad: the length is checked once, by the caller
    version = (layout.format_revision, layout.content_revision)
    extract, source = _generate(layout.name, codec, stored, version)
    return Extractor(layout.name, layout.size, extract, source)


def compile_v1_9(data: bytes, structure_size: int) -> Extractor:
    """The extractor of the v1.9 record list in `data`; it reads every encoding to check it later."""
    count = V1_9_FIXED.unpack_from(data)[3]
    position, end = V1_9_FIXED.size, structure_size
    if count < 0 or count > (end - position) // V1_9_ENCODING.size:
        raise FastExtractError(f"gpu_metrics v1.9 attr_count {count} does not fit in {end} bytes")
    parts = ["<", f"{position}x"]
    stored: dict[str, _Stored] = {}
    encodings: list[int] = []
    seen: set[int] = set()
    flat = 0
    for index in range(count):
        if position + V1_9_ENCODING.size > end:
            raise FastExtractError(f"gpu_metrics v1.9 record {index} of {count} runs past byte {end}")
        (encoding,) = V1_9_ENCODING.unpack_from(data, position)
        encodings.append(encoding)
        parts.append("Q")
        flat += 1
        position += V1_9_ENCODING.size
        type_code = (encoding >> ATTR_TYPE_SHIFT) & ATTR_TYPE_MASK
        if type_code not in _TYPE_CODES:
            raise FastExtractError(f"gpu_metrics v1.9 record {index} has unknown value type {type_code}")
        value_type = AttrType(type_code)
        code, width = ATTR_TYPE_FORMAT[value_type]
        instances = encoding & ATTR_INSTANCES_MASK
        if position + instances * width > end:
            raise FastExtractError(f"gpu_metrics v1.9 record {index} ({instances} values) runs past byte {end}")
        attr_id = (encoding >> ATTR_ID_SHIFT) & ATTR_ID_MASK
        name = ATTR_NAMES[attr_id] if attr_id < len(ATTR_NAMES) else ""
        # The first record of an id wins, as in the full decoder; a repeat is skipped like the rest.
        first_of_its_id = attr_id not in seen
        seen.add(attr_id)
        if name in WANTED_FIELDS and first_of_its_id and instances:
            parts.append(f"{instances}{code}")
            half = 1 << (8 * width - 1) if value_type in SIGNED_ATTR_TYPES else 0
            unit = (encoding >> ATTR_UNIT_SHIFT) & ATTR_UNIT_MASK
            stored[name] = _Stored(flat, instances, (1 << (8 * width)) - 1, half, unit)
            flat += instances
        elif instances:
            parts.append(f"{instances * width}x")
        position += instances * width
    fast, source = _generate(f"v1_9/{count}", struct.Struct("".join(parts)), stored, (1, 9))
    expected = tuple(encodings)
    check = struct.Struct("<" + "".join(_encoding_only(parts))).unpack_from

    def extract(blob: bytes) -> tuple[float, ...]:
        if check(blob) != expected:
            raise _Recompile
        return fast(blob)

    return Extractor(f"v1_9/{count}", position, extract, source, expected)


def _encoding_only(parts: list[str]) -> list[str]:
    """The same format with value fields turned into pad bytes: it unpacks only the encodings."""
    out = []
    for part in parts[1:]:
        if part == "Q" or part.endswith("x"):
            out.append(part)
        else:
            number, code = int(part[:-1]), part[-1]
            out.append(f"{number * struct.calcsize('<' + code)}x")
    return out


class _Recompile(Exception):
    """A v1.9 table whose records differ from the ones its cached extractor was compiled for."""


_FIXED: dict[tuple[int, int, int], Extractor] = {
    (layout.size, layout.format_revision, layout.content_revision): compile_fixed(layout) for layout in FIXED_LAYOUTS
}
_FIXED_REVISIONS = {(layout.format_revision, layout.content_revision) for layout in FIXED_LAYOUTS}
_V1_9: dict[tuple[int, int], Extractor] = {}  # (structure_size, attr_count) -> last compiled
_V1_9_CACHE_LIMIT = 64  # record lists seen; a device cycling through more is not a real table


def extract_fast(blob: bytes) -> tuple[float, ...]:
    """CHANNELS-ordered floats of one gpu_metrics read (NaN = not supplied); FastExtractError if unreadable."""
    if len(blob) < HEADER_SIZE:
        raise FastExtractError(f"blob of {len(blob)} bytes shorter than the {HEADER_SIZE}-byte header")
    key = HEADER.unpack_from(blob)
    extractor = _FIXED.get(key)
    if extractor is not None:
        if len(blob) < key[0]:
            raise FastExtractError(f"blob of {len(blob)} bytes shorter than structure_size {key[0]}")
        return extractor.extract(blob)
    structure_size, format_revision, content_revision = key
    if (format_revision, content_revision) == (V1_9_FORMAT_REVISION, V1_9_CONTENT_REVISION):
        return _extract_v1_9(blob, structure_size)
    if (format_revision, content_revision) in _FIXED_REVISIONS:
        raise FastExtractError(
            f"gpu_metrics v{format_revision}.{content_revision} with unknown structure_size {structure_size}"
        )
    raise FastExtractError(f"unknown gpu_metrics revision {format_revision}.{content_revision}")


def _extract_v1_9(blob: bytes, structure_size: int) -> tuple[float, ...]:
    if len(blob) < structure_size:
        raise FastExtractError(f"blob of {len(blob)} bytes shorter than structure_size {structure_size}")
    if structure_size < V1_9_FIXED.size:
        raise FastExtractError(f"gpu_metrics v1.9 structure_size {structure_size} shorter than its header")
    cache_key = (structure_size, V1_9_FIXED.unpack_from(blob)[3])
    extractor = _V1_9.get(cache_key)
    if extractor is not None:
        try:
            return extractor.extract(blob)
        except _Recompile:
            pass
    try:
        extractor = compile_v1_9(blob, structure_size)
    except struct.error as error:
        raise FastExtractError(f"gpu_metrics v1.9 table cannot be read: {error}") from error
    if len(_V1_9) >= _V1_9_CACHE_LIMIT:
        _V1_9.clear()
    _V1_9[cache_key] = extractor
    return extractor.extract(blob)


def extractor_for(blob: bytes) -> Extractor:
    """The compiled extractor that reads this table (tests and the bench inspect it)."""
    extract_fast(blob)
    key = HEADER.unpack_from(blob)
    found = _FIXED.get(key) or _V1_9[(key[0], V1_9_FIXED.unpack_from(blob)[3])]
    return found
