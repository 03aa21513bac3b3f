"""The sysfs reader table: every row names a real Sample field and a file the driver writes, and the
layers fill fields in the documented order (slow layer < gpu_metrics < per-cycle files by fill rule)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.model import SAMPLE_MAPPINGS, DeviceIdentity, Sample, frozen_map
from exporter.simulator import Simulator
from exporter.sources.sysfs import SysfsSource
from exporter.sources.sysfs.table import CYCLE_FILES, SLOW_FILES, SampleValues, read_rows


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> tuple[SysfsSource, list[DeviceIdentity]]:
    root = tmp_path_factory.mktemp("node") / "sys"
    Simulator(root, "1xMI210,1xMI250X,1xMI300X,1xMI355X", "training", seed=5).write_tree()
    source = SysfsSource(root)
    return source, list(source.discover())


def test_every_row_names_a_sample_field_with_a_key_exactly_when_it_is_a_mapping() -> None:
    fields = {f.name for f in dataclasses.fields(Sample)}
    for row in (*CYCLE_FILES, *SLOW_FILES):
        assert row.field in fields, f"{row.file} fills unknown Sample field {row.field!r}"
        assert (row.key is not None) == (row.field in SAMPLE_MAPPINGS), f"{row.file}: key {row.key!r}"


def test_every_row_reads_a_file_the_simulated_driver_writes(node) -> None:
    _, devices = node
    for row in (*CYCLE_FILES, *SLOW_FILES):
        paths = [row.path(device) for device in devices]
        assert any(path is not None and os.path.exists(path) for path in paths), f"no device has {row.file}"
        values = SampleValues()
        for device in devices:
            read_rows((dataclasses.replace(row, fill="always"),), device, values)
        assert values.supplied(row.field, row.key), f"{row.file} parsed to nothing on every device"


def test_hwmon_temperatures_fill_only_when_gpu_metrics_supplied_none(node) -> None:
    _, devices = node
    device = devices[0]
    rows = [row for row in CYCLE_FILES if row.field == "temperatures"]
    empty = SampleValues()
    read_rows(rows, device, empty)
    assert set(empty.mappings["temperatures"]) == {"edge", "junction", "memory"}
    partial = SampleValues()
    partial.set("temperatures", "junction", 70.0)  # as if gpu_metrics supplied only the junction
    read_rows(rows, device, partial)
    assert partial.mappings["temperatures"] == {"junction": 70.0}, "no mixing of gpu_metrics and hwmon readings"


def test_if_missing_rows_never_override_and_the_first_of_two_wins(node, tmp_path: Path) -> None:
    _, devices = node
    device = devices[0]
    power_rows = [row for row in CYCLE_FILES if row.field == "power_watts"]
    assert [row.file for row in power_rows] == ["power1_average", "power1_input"]
    supplied = SampleValues()
    supplied.set("power_watts", None, 123.0)
    read_rows(power_rows, device, supplied)
    assert supplied.scalars["power_watts"] == 123.0
    hwmon = tmp_path / "hwmon"
    hwmon.mkdir()
    (hwmon / "power1_input").write_text("250000000\n")
    fake = dataclasses.replace(device, hwmon_dir=str(hwmon))
    fallback = SampleValues()
    read_rows(power_rows, fake, fallback)
    assert fallback.scalars["power_watts"] == 250.0, "power1_input when power1_average is absent"
    (hwmon / "power1_average").write_text("200000000\n")
    both = SampleValues()
    read_rows(power_rows, fake, both)
    assert both.scalars["power_watts"] == 200.0


def test_gpu_metrics_win_over_the_slow_layer_keeping_its_key_order(node) -> None:
    source, devices = node
    sample = source.read(devices[0])  # MI210: gpu_metrics v1.3 supplies gfx, soc, memory, video, decode
    assert list(sample.clocks_hertz)[:3] == ["gfx", "memory", "fabric"], "DPM domain order, as before the table"
    assert sample.temperature_thresholds[("junction", "critical")] > 0
    assert sample.memory_total_bytes["vram"] > sample.memory_used_bytes["vram"] > 0


def test_the_second_die_of_a_dual_die_package_reports_no_power(node) -> None:
    source, devices = node
    dies = [d for d in devices if d.product.startswith("AMD Instinct MI250X")]
    assert [d.die for d in dies] == [0, 1]
    first, second = (source.read(d) for d in dies)
    assert first.power_watts is not None and first.energy_joules is not None
    assert second.power_watts is None and second.energy_joules is None
    assert second.temperatures, "the second die still reads everything else"


# --- the Sample built from SampleValues ------------------------------------------------------------------

_SCALARS = sorted(f.name for f in dataclasses.fields(Sample) if f.name not in SAMPLE_MAPPINGS and f.name != "timestamp")
_values = st.one_of(st.none(), st.floats(allow_nan=False), st.integers(), st.tuples(st.floats(allow_nan=False)))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_SCALARS), _values),
    st.dictionaries(
        st.sampled_from(sorted(SAMPLE_MAPPINGS - {"file_errors"})),
        st.dictionaries(st.text(max_size=3), st.floats(allow_nan=False), max_size=3),
    ),
    st.dictionaries(st.tuples(st.text(max_size=3), st.sampled_from(["eio", "parse"])), st.integers(1, 9), max_size=2),
)
def test_the_sample_holds_exactly_the_values_assembled(
    scalars: dict[str, object], mappings: dict[str, dict[object, float]], errors: dict[tuple[str, str], int]
) -> None:
    values = SampleValues()
    values.scalars.update(scalars)
    for name, mapping in mappings.items():
        values.mapping(name).update(mapping)
    expected = Sample(
        timestamp=12.5,
        **scalars,  # type: ignore[arg-type]
        **{name: frozen_map(mapping) for name, mapping in mappings.items()},
        file_errors=frozen_map(errors),
    )
    built = values.sample(12.5, frozen_map(errors))
    assert built == expected
    assert all(isinstance(getattr(built, name), MappingProxyType) for name in SAMPLE_MAPPINGS)  # read-only
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.power_watts = 1.0  # type: ignore[misc]


def test_a_scalar_that_is_no_sample_field_is_refused() -> None:
    values = SampleValues()
    values.scalars["power_wats"] = 1.0
    with pytest.raises(TypeError, match="power_wats"):
        values.sample(1.0)


def test_every_value_the_source_returns_was_checked(tmp_path: Path) -> None:
    """values_checked is a promise the poller relies on (it skips its own check): absurd values in
    every file the table reads, and in KFD's partition sizes, never reach a Sample."""
    from exporter.sources.plausible import without_implausible

    root = tmp_path / "sys"
    Simulator(root, "1xMI250X,1xMI300X:CPX", "training", seed=3).write_tree()
    source = SysfsSource(root, slow_interval=0.0)
    assert source.values_checked is True
    devices = list(source.discover())
    absurd = {"temp": "1000000000\n", "power": "99999999999999\n", "mem_info": "18446744073709551615\n"}
    for device in devices:
        for row in (*CYCLE_FILES, *SLOW_FILES):
            path = row.path(device)
            if path is not None and os.path.isfile(path):
                kind = next((k for k in absurd if row.file.startswith(k)), "mem_info")
                Path(path).write_text(absurd[kind])
    for properties in root.rglob("mem_banks/*/properties"):
        text = properties.read_text()
        properties.write_text(
            "\n".join(
                f"size_in_bytes {2**60}" if line.startswith("size_in_bytes") else line for line in text.splitlines()
            )
            + "\n"
        )
    devices = list(source.discover())  # partition sizes are read at discovery
    rejected = 0
    for device in devices:
        sample = source.read(device)
        assert without_implausible(sample) == (sample, {}), device.key
        rejected += sum(n for (_, reason), n in sample.file_errors.items() if reason == "implausible")
    assert rejected >= len(devices)  # rejected and counted against their files, not dropped silently
    source.close()
