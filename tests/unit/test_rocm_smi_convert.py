"""rocm_smi/convert.py: the library's readings (its units) -> Sample / DeviceIdentity (SI units)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.abi.gpu_metrics import C_TYPES, V1_1
from exporter.model import DeviceIdentity, Sample, TopologyLink, frozen_map
from exporter.sources.rocm_smi import convert


def table(**fields: int | list[int]) -> str:
    """An rsmi_gpu_metrics_t as the worker sends it (hex): the given fields, all-ones elsewhere."""
    raw = bytearray(b"\xff" * V1_1.size)
    for field in V1_1.fields:
        if field.name in fields:
            value = fields[field.name]
            values = value if isinstance(value, list) else [value]
            struct.pack_into(f"<{field.count}{C_TYPES[field.ctype][0]}", raw, field.offset, *values)
    return raw.hex()


METRICS = {
    "temperature_vrgfx": 39,
    "temperature_vrsoc": 38,
    "current_gfxclk": 1650,
    "current_socclk": 1090,
    "current_uclk": 1600,
    "current_vclk0": 0,
    "pcie_link_width": 16,
    "pcie_link_speed": 160,
    "temperature_hbm": [45, 46, 0xFFFF, 47],
}
# One every-cycle read and one slow read of an MI250X primary die as the worker returns them.
CYCLE = {
    "temperatures": {"edge": {"current": 41000}, "junction": {"current": 47000}, "memory": {"current": 44000}},
    "gpu_metrics": table(**METRICS),  # type: ignore[arg-type]
    "energy": {"ticks": 1 << 20, "resolution_uj": 15.3, "timestamp_ns": 5},
    "power_average": 301_500_000,
    "busy_percent": 37,
    "memory_busy_percent": 12,
    "memory_used": {"vram": 1 << 30, "gtt": 4096},
    "vddgfx_mv": 806,
}
SLOW = {
    "temperatures": {
        "edge": {"current": 41000, "critical": 100000, "emergency": 105000},
        "junction": {"current": 47000, "critical": 110000},
    },
    "power_cap": 560_000_000,
    "power_cap_max": 0,
    "memory_total": {"vram": 64 << 30},
    "clocks": {
        "gfx": {"current": 1, "hertz": [500_000_000, 1_700_000_000]},
        "fabric": {"current": 33, "hertz": [400_000_000, 1_200_000_000]},  # 33: no level marked
    },
    "pcie_levels": {"current": 0, "transfers": [16_000_000_000, 2_500_000_000], "lanes": [16, 8]},
    "pcie_replays": 9,
    "ecc": {"umc": [7, 1]},
    "retired_pages": {"0": 3, "1": 2},
}


def make(readings: dict = CYCLE, slow: dict = SLOW, **kwargs: object) -> Sample:
    return convert.sample_from_readings(readings, slow, 12.5, **kwargs)  # type: ignore[arg-type]


def test_temperatures_take_hwmon_sensors_and_gpu_metrics_extras_in_celsius() -> None:
    sample = make()
    assert dict(sample.temperatures) == {
        "edge": 41.0,
        "junction": 47.0,
        "memory": 44.0,
        "vr_gfx": 39.0,
        "vr_soc": 38.0,
        "hbm0": 45.0,
        "hbm1": 46.0,
        "hbm3": 47.0,
    }
    assert dict(sample.temperature_thresholds) == {
        ("edge", "critical"): 100.0,
        ("edge", "emergency"): 105.0,
        ("junction", "critical"): 110.0,
    }


def test_energy_uses_the_hardware_tick_not_the_librarys_15_3_microjoules() -> None:
    sample = make()
    assert sample.energy_joules == pytest.approx(16.0)  # 2^20 ticks x 2^-16 J
    assert sample.energy_joules != pytest.approx((1 << 20) * 15.3e-6)


def test_all_ones_energy_is_absent() -> None:
    assert make({**CYCLE, "energy": {"ticks": (1 << 64) - 1}}).energy_joules is None


def test_power_caps_and_units() -> None:
    sample = make()
    assert sample.power_watts == pytest.approx(301.5)
    assert sample.power_cap_watts == pytest.approx(560.0)
    assert sample.power_cap_max_watts is None  # a cap of 0 is no cap


def test_second_die_shows_no_power_or_energy_and_a_partition_not_the_sockets_busy() -> None:
    die1 = DeviceIdentity("0000:43:00.0", "card2", "", die=1)
    sample = convert.for_device(make(), die1, 3)
    assert sample.power_watts is None and sample.energy_joules is None
    assert sample.power_cap_watts == pytest.approx(560.0) and sample.xgmi_error_events == 3
    assert dict(sample.busy) == {"gfx": 0.37, "memory": 0.12}
    partition0 = DeviceIdentity("0000:43:00.0", "card2", "", compute_partition="CPX")
    sample = convert.for_device(make(), partition0, None)
    assert sample.power_watts == pytest.approx(301.5) and dict(sample.busy) == {"memory": 0.12}


def test_busy_memory_and_voltage() -> None:
    sample = make()
    assert dict(sample.busy) == {"gfx": 0.37, "memory": 0.12}  # media all-ones: absent
    assert dict(sample.memory_used_bytes) == {"vram": float(1 << 30), "gtt": 4096.0}
    assert dict(sample.memory_total_bytes) == {"vram": float(64 << 30)}
    assert dict(sample.voltages_volts) == {"gfx": pytest.approx(0.806)}


def test_clocks_current_from_gpu_metrics_over_dpm_tables_and_max_from_tables() -> None:
    sample = make()
    assert dict(sample.clocks_hertz) == {
        "gfx": 1650e6,  # gpu_metrics wins over the marked DPM level
        "soc": 1090e6,
        "memory": 1600e6,
        "video": 0.0,  # 0 is a reading; only all-ones is absent (decode)
    }
    assert dict(sample.clocks_max_hertz) == {"gfx": 1700e6, "fabric": 1200e6}


def test_pcie_link_current_from_gpu_metrics_max_from_dpm_levels() -> None:
    sample = make()
    assert sample.pcie_link_transfers_per_second == 16e9
    assert sample.pcie_link_width == 16
    assert sample.pcie_max_link_transfers_per_second == 16e9
    assert sample.pcie_max_link_width == 16
    assert sample.pcie_replays == 9


def test_pcie_esm_code_is_left_out_and_the_dpm_level_used() -> None:
    metrics = {**METRICS, "pcie_link_speed": 0x80 + 44, "pcie_link_width": 0xFFFF}
    readings = {**CYCLE, "gpu_metrics": table(**metrics)}  # type: ignore[arg-type]
    sample = make(readings)
    # ESM code 172 is not a rate: the marked pp_dpm_pcie level (index 0) stands instead
    assert sample.pcie_link_transfers_per_second == 16e9
    assert sample.pcie_link_width == 16


def test_ecc_and_retired_pages() -> None:
    sample = make()
    assert dict(sample.ecc_errors) == {("umc", "correctable"): 7, ("umc", "uncorrectable"): 1}
    assert sample.ras_retired_pages == 3  # reserved only, as the sysfs source counts R pages
    assert sample.ras_pending_pages == 2  # status 1, the P lines


def test_pcie_bandwidth_only_from_a_throughput_reading() -> None:
    assert make().pcie_bandwidth_upper_bound_bytes_per_second is None
    readings = {**CYCLE, "pcie_throughput": {"sent": 10, "received": 30, "max_payload": 256}}
    assert make(readings).pcie_bandwidth_upper_bound_bytes_per_second == 40 * 256


def test_missing_readings_give_an_empty_sample() -> None:
    sample = convert.sample_from_readings({}, {}, 3.0)
    assert sample == Sample(timestamp=3.0)


def test_overlay_prefers_library_values_and_fills_the_rest_from_the_fallback() -> None:
    fallback = Sample(
        timestamp=1.0,
        temperatures=frozen_map({"edge": 40.0, "vr_mem": 35.0}),
        throttle=frozen_map({"ppt0": True}),
        voltages_volts=frozen_map({"soc": 0.8}),
        power_watts=100.0,
        pcie_naks_sent=4,
    )
    library = Sample(timestamp=2.0, temperatures=frozen_map({"edge": 41.0}), power_watts=None, pcie_replays=9)
    merged = convert.overlay(fallback, library)
    assert merged.timestamp == 2.0
    assert dict(merged.temperatures) == {"edge": 41.0, "vr_mem": 35.0}
    assert dict(merged.throttle) == {"ppt0": True}
    assert dict(merged.voltages_volts) == {"soc": 0.8}
    assert merged.power_watts == 100.0
    assert merged.pcie_replays == 9 and merged.pcie_naks_sent == 4


def test_direct_links_keep_one_hop_gpu_links_with_the_520_type_numbering() -> None:
    links = [
        {"peer": 1, "type": 2, "hops": 1, "weight": 15},  # 5.2.3: 2 = XGMI
        {"peer": 2, "type": 1, "hops": 2, "weight": 40},  # through the CPU: a path, not a link
        {"peer": 9, "type": 2, "hops": 1, "weight": 15},  # unknown index
    ]
    assert convert.direct_links(links, {1: "0000:43:00.0", 2: "0000:01:00.0"}) == (
        TopologyLink("0000:43:00.0", "xgmi", 1, 15),
    )


def test_identity_merge_keeps_fallback_only_fields_and_takes_library_reads() -> None:
    fallback = DeviceIdentity(
        pci_bus_id="0000:41:00.0",
        card="card1",
        device_dir="/sys/devices/x",
        unique_id="00000000000000aa",
        hwmon_dir="/sys/devices/x/hwmon/hwmon3",
        product="AMD Instinct MI250X",
        package="P1",
        die=0,
        firmware=frozen_map({"mes": "0x00000001", "sos": "0x00000002"}),
        topology=(TopologyLink("", "pcie", 1, 20), TopologyLink("0000:43:00.0", "xgmi", 1, 15)),
        gpu_metrics_version="1.3",
    )
    library = convert.identity_from_library(
        {
            "unique_id": "00000000000000aa",
            "product": "Aldebaran/MI200 [Instinct MI250X/MI250]",
            "serial": "S1",
            "vbios": "113-D65201-042",
            "device_id": "0x740c",
            "xgmi_hive_id": "77",
            "numa_node": 4294967295,  # -1 as uint32: no NUMA node
            "firmware": {"sos": 0x21},
            "links": [{"peer": 1, "type": 2, "hops": 1, "weight": 15}],
        },
        pci_bus_id="0000:41:00.0",
        card="card1",
        device_dir="/sys/devices/x",
        driver_version="6.8.0",
        peer_bus_ids={1: "0000:43:00.0"},
    )
    assert library.numa_node is None
    merged = convert.merge_identity(fallback, library)
    assert merged.product == "AMD Instinct MI250X"  # the fallback's spelling when it has one
    assert (merged.serial, merged.vbios, merged.device_id, merged.xgmi_hive_id) == (
        "S1",
        "113-D65201-042",
        "0x740c",
        "77",
    )
    assert dict(merged.firmware) == {"mes": "0x00000001", "sos": "0x00000021"}
    assert merged.topology == fallback.topology
    assert (merged.hwmon_dir, merged.package, merged.gpu_metrics_version) == (fallback.hwmon_dir, "P1", "1.3")
    assert merged.driver_version == "6.8.0"


_readings = st.fixed_dictionaries(
    {},
    optional={
        "temperatures": st.dictionaries(
            st.sampled_from(["edge", "junction", "memory"]),
            st.dictionaries(st.sampled_from(["current", "critical", "emergency"]), st.integers(-(2**63), 2**63 - 1)),
        ),
        "gpu_metrics": st.binary(max_size=2 * V1_1.size).map(bytes.hex),
        "power_average": st.integers(0, 2**64 - 1),
        "busy_percent": st.integers(0, 2**32 - 1),
        "energy": st.fixed_dictionaries({"ticks": st.integers(0, 2**64 - 1)}),
    },
)


@given(_readings)
def test_any_worker_reading_converts_without_error(readings: dict) -> None:
    sample = convert.sample_from_readings(readings, readings, 0.0)
    assert all(isinstance(v, float) for v in sample.temperatures.values())


def test_identity_merge_keeps_the_fallbacks_links_when_the_library_reports_none() -> None:
    gpu_link = TopologyLink("0000:43:00.0", "xgmi", 1, 15)
    fallback = DeviceIdentity("0000:41:00.0", "card1", "", topology=(TopologyLink("", "pcie", 1, 20), gpu_link))
    library = convert.identity_from_library(
        {"links": []},
        pci_bus_id="0000:41:00.0",
        card="card1",
        device_dir="",
        driver_version="",
        peer_bus_ids={},
    )
    assert convert.merge_identity(fallback, library).topology == fallback.topology


def test_the_overlay_keeps_the_fallbacks_cper_records() -> None:
    """Neither library reads the CPER ring: its empty tuple must not hide what sysfs read."""
    from exporter.model import CperRecord, Sample
    from exporter.sources.rocm_smi.convert import overlay

    record = CperRecord(1.0, "fatal", (), "0:1")
    merged = overlay(Sample(1.0, cper_records=(record,), last_reset_at=5.0), Sample(2.0, ras_pending_pages=3))
    assert merged.cper_records == (record,) and merged.last_reset_at == 5.0 and merged.ras_pending_pages == 3
