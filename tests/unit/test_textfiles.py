"""Text-file parsers: real kernel outputs, rejections, and hypothesis properties.

Examples are the kernel's own formats (amdgpu_pm.c, aldebaran_ppt.c, smu_v13_0_6_ppt.c, smu_cmn.c,
amdgpu_ras.c, drivers/pci, kfd_topology.c). Round trips format a value the way the kernel's printf
does and parse it back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.sources.textfiles import (
    BadPages,
    DpmLevels,
    PcieBw,
    RasCounts,
    TextParseError,
    TextUnavailableError,
    parse_aer_total,
    parse_bad_pages,
    parse_devcoredump_time,
    parse_fw_version,
    parse_hex_id,
    parse_key_values,
    parse_link_speed,
    parse_link_width,
    parse_pcie_bw,
    parse_percent_ratio,
    parse_pp_dpm,
    parse_ras_err_count,
    parse_scaled,
    parse_signed,
    parse_uevent,
    parse_unique_id,
    parse_unsigned,
    parse_word,
)

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

# ---------------------------------------------------------------------------------------------------
# Examples from real kernel formats
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0\n", 0), ("68702699520\n", 68702699520), ("18446744073709551615\n", U64_MAX), ("  42 \n", 42)],
)
def test_unsigned_examples(text: str, expected: int) -> None:
    assert parse_unsigned(text) == expected


@pytest.mark.parametrize(
    "text", ["", "\n", "abc", "-5\n", "1.5\n", "18446744073709551616\n", "1 2", "0x10", "+5", "1_000", "١٢", "4\x002"]
)
def test_unsigned_rejects(text: str) -> None:
    with pytest.raises(TextParseError):
        parse_unsigned(text)


def test_only_ascii_whitespace_is_surrounding_whitespace() -> None:
    # str.strip() would also remove NEL and NO-BREAK SPACE; no kernel writer emits them.
    for text in ("\xa042\n", "42\x85", "\u200342"):
        with pytest.raises(TextParseError):
            parse_unsigned(text)
    with pytest.raises(TextParseError):
        parse_word("\x85auto\n")


def test_huge_digit_strings_are_parse_errors() -> None:
    # Past 4300 digits int() itself raises ValueError; the length guard answers first.
    for parser in (parse_unsigned, parse_signed, parse_percent_ratio, parse_link_width):
        with pytest.raises(TextParseError, match="out of range"):
            parser("9" * 5000)
    with pytest.raises(TextParseError, match="out of range"):
        parse_scaled("-" + "9" * 5000, 1e-3)
    assert parse_unsigned("0" * 5000 + "7") == 7  # leading zeros are not magnitude


def test_signed_examples_and_range() -> None:
    assert parse_signed("-40000\n") == -40000
    assert parse_signed("9223372036854775807") == I64_MAX
    assert parse_signed("-9223372036854775808") == I64_MIN
    for bad in ("9223372036854775808", "-9223372036854775809", "", "--1", "1-", "abc"):
        with pytest.raises(TextParseError):
            parse_signed(bad)


def test_percent_ratio() -> None:
    assert parse_percent_ratio("37\n") == 0.37
    assert parse_percent_ratio("0\n") == 0.0
    assert parse_percent_ratio("100\n") == 1.0
    # The library reads "abc" and "" as 0 %: here they are errors.
    for bad in ("abc\n", "", "101\n", "-1\n", "37%\n", "37.5\n", "65535\n"):
        with pytest.raises(TextParseError):
            parse_percent_ratio(bad)


@pytest.mark.parametrize(
    ("text", "scale", "expected"),
    [
        ("45000\n", 1e-3, 45.0),  # temp2_input millidegC
        ("45123\n", 1e-3, 45.123),
        ("-5000\n", 1e-3, -5.0),
        ("300000000\n", 1e-6, 300.0),  # power1_average uW
        ("560000000\n", 1e-6, 560.0),  # power1_cap_max
        ("818\n", 1e-3, 0.818),  # in0_input mV
        ("1700000000\n", 1, 1.7e9),  # freq1_input Hz
        ("0\n", 1e-6, 0.0),  # GCD1 power reads 0
    ],
)
def test_scaled_examples(text: str, scale: float, expected: float) -> None:
    assert parse_scaled(text, scale) == expected


def test_scaled_rejects_bad_text_and_bad_scale() -> None:
    for bad in ("", "45.0\n", "N/A\n", "18446744073709551616"):
        with pytest.raises(TextParseError):
            parse_scaled(bad, 1e-3)
    for scale in (0.0, float("nan"), float("inf")):
        with pytest.raises(TextParseError):
            parse_scaled("1\n", scale)


# pp_dpm_* ------------------------------------------------------------------------------------------


def test_pp_dpm_discrete_levels() -> None:
    # aldebaran mclk: "%d: %uMhz %s\n" -> unmarked lines end in a space.
    levels = parse_pp_dpm("0: 400Mhz \n1: 700Mhz \n2: 1200Mhz \n3: 1600Mhz *\n")
    assert levels == DpmLevels((400e6, 700e6, 1200e6, 1600e6), 3, None)
    assert levels.current_hertz == 1600e6
    assert levels.max_hertz == 1600e6


def test_pp_dpm_fine_grained_sclk_three_lines() -> None:
    # aldebaran sclk between min and max: min, current, max with the middle one marked.
    levels = parse_pp_dpm("0: 500Mhz \n1: 1403Mhz *\n2: 1700Mhz \n")
    assert levels.levels_hertz == (500e6, 1403e6, 1700e6)
    assert levels.current_index == 1
    assert levels.current_hertz == 1403e6
    assert levels.max_hertz == 1700e6


def test_pp_dpm_brief_example_and_mhz_spelling() -> None:
    assert parse_pp_dpm("0: 500Mhz\n1: 1700Mhz *\n").current_hertz == 1700e6
    assert parse_pp_dpm("0: 500MHz\n1: 1700MHz *\n").levels_hertz == (500e6, 1700e6)


def test_pp_dpm_deep_sleep_smu_v13_0_6_style() -> None:
    # smu_v13_0_6_print_clks: "S: %uMhz *" then "%d: %uMhz" from 0, none marked.
    levels = parse_pp_dpm("S: 19Mhz *\n0: 500Mhz\n1: 2100Mhz\n")
    assert levels == DpmLevels((500e6, 2100e6), None, 19e6)
    assert levels.current_hertz == 19e6
    assert levels.max_hertz == 2100e6


def test_pp_dpm_deep_sleep_smu_cmn_style_numbers_from_one() -> None:
    # smu_cmn_print_dpm_clk_levels: level_index = 1 after the S: line, "%s" = "" leaves a space.
    levels = parse_pp_dpm("S: 8Mhz *\n1: 100Mhz \n2: 1900Mhz \n")
    assert levels.levels_hertz == (100e6, 1900e6)
    assert levels.deep_sleep_hertz == 8e6
    assert levels.current_index is None


def test_pp_dpm_fine_grained_f_line() -> None:
    levels = parse_pp_dpm("F: 1120Mhz *\n0: 500Mhz \n1: 1900Mhz \n")
    assert levels.fine_grained_hertz == 1120e6
    assert levels.current_hertz == 1120e6
    assert levels.deep_sleep_hertz is None


def test_pp_dpm_two_marked_levels_take_the_first() -> None:
    # aldebaran_freqs_in_same_level marks every level within 25 MHz of the clock.
    levels = parse_pp_dpm("0: 1200Mhz *\n1: 1210Mhz *\n")
    assert levels.current_index == 0


def test_pp_dpm_no_level_marked() -> None:
    levels = parse_pp_dpm("0: 500Mhz \n1: 1700Mhz \n")
    assert levels.current_index is None
    assert levels.current_hertz is None


def test_pp_dpm_unavailable_after_ras_interrupt() -> None:
    with pytest.raises(TextUnavailableError):
        parse_pp_dpm("unavailable\n")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "abc\n",
        "1: 500Mhz\n2: 1700Mhz\n",  # does not start at 0
        "0: 500Mhz\n2: 1700Mhz\n",  # gap
        "0: 500Mhz\n0: 1700Mhz\n",  # repeated
        "0: 500Mhz\n\n1: 1700Mhz\n",  # blank line inside
        "0: 500\n",  # no unit
        "0: 500kHz\n",
        "0: -500Mhz\n",
        "0: 5.5Mhz\n",
        "0: 4294967296Mhz\n",  # past %u
        "S: 19Mhz *\n",  # deep sleep without levels
        "S: 19Mhz *\nS: 19Mhz *\n0: 500Mhz\n",
        "0: 500Mhz\nS: 19Mhz *\n",  # S: is only ever the first line
        "S: 19Mhz *\n2: 500Mhz\n",
        "GFXCLK:\n0: 500Mhz\n",  # pp_od_clk_voltage, not pp_dpm
        "0: 500Mhz *\x00\n",
    ],
)
def test_pp_dpm_rejects(text: str) -> None:
    with pytest.raises(TextParseError):
        parse_pp_dpm(text)


def test_pp_dpm_malformed_is_not_unavailable() -> None:
    with pytest.raises(TextParseError) as info:
        parse_pp_dpm("0: 500\n")
    assert not isinstance(info.value, TextUnavailableError)


# PCI core link files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16.0 GT/s PCIe\n", 16e9),
        ("8.0 GT/s PCIe\n", 8e9),
        ("2.5 GT/s PCIe\n", 2.5e9),
        ("32.0 GT/s PCIe\n", 32e9),
        ("64.0 GT/s PCIe\n", 64e9),
        ("16 GT/s\n", 16e9),  # kernels before pci_speed_string
        ("5 GT/s\n", 5e9),
        ("2.5 GT/s\n", 2.5e9),
    ],
)
def test_link_speed_examples(text: str, expected: float) -> None:
    assert parse_link_speed(text) == expected


@pytest.mark.parametrize("text", ["Unknown\n", "Unknown speed\n"])
def test_link_speed_unknown_is_unavailable(text: str) -> None:
    with pytest.raises(TextUnavailableError):
        parse_link_speed(text)


@pytest.mark.parametrize("text", ["", "133 MHz PCI-X 533\n", "8x AGP\n", "16.0\n", "0 GT/s\n", "fast\n"])
def test_link_speed_rejects(text: str) -> None:
    with pytest.raises(TextParseError) as info:
        parse_link_speed(text)
    assert not isinstance(info.value, TextUnavailableError)


def test_link_width() -> None:
    assert parse_link_width("16\n") == 16
    assert parse_link_width("0\n") == 0  # link down
    # 63: the width field of an all-ones LNKSTA, i.e. the device fell off the bus.
    for bad in ("63\n", "3\n", "x16\n", "", "-16\n"):
        with pytest.raises(TextParseError):
            parse_link_width(bad)


# RAS -----------------------------------------------------------------------------------------------


def test_ras_err_count_two_lines() -> None:
    assert parse_ras_err_count("ue: 0\nce: 3\n") == RasCounts(correctable=3, uncorrectable=0, deferred=None)


def test_ras_err_count_with_deferred_line() -> None:
    assert parse_ras_err_count("ue: 1\nce: 2\nde: 5\n") == RasCounts(2, 1, 5)


def test_ras_err_count_inaccessible() -> None:
    with pytest.raises(TextUnavailableError):
        parse_ras_err_count("Query currently inaccessible\n")


@pytest.mark.parametrize(
    "text",
    ["", "ue: 0\n", "ce: 3\n", "ue: 0\nce: 3\nce: 4\n", "ue: 0\nce: -3\n", "ue: 0\nce: 3\nxx: 1\n", "ue 0\nce 3\n"],
)
def test_ras_err_count_rejects(text: str) -> None:
    with pytest.raises(TextParseError):
        parse_ras_err_count(text)


def test_bad_pages() -> None:
    text = "0x00000123 : 0x00001000 : R\n0x00000456 : 0x00001000 : P\n0x00000789 : 0x00001000 : F\n"
    assert parse_bad_pages(text) == BadPages(retired=1, pending=1)  # a faulted (F) record counts in neither
    assert parse_bad_pages("") == BadPages(retired=0, pending=0)  # no bad pages: the read returns nothing
    for bad in ("0x00000123 : 0x00001000 : X\n", "0x123 : R\n", "garbage\n", "0x00000123 : 0x00001000 : R\nx\n"):
        with pytest.raises(TextParseError):
            parse_bad_pages(bad)


# identity ------------------------------------------------------------------------------------------


def test_fw_version() -> None:
    assert parse_fw_version("0x0000001a\n") == "0x0000001a"
    assert parse_fw_version("0x0000001A\n") == "0x0000001a"
    assert parse_fw_version("0x1a\n") == "0x0000001a"
    for bad in ("", "1a\n", "0x\n", "0x100000000\n", "0x1g\n"):
        with pytest.raises(TextParseError):
            parse_fw_version(bad)


def test_unique_id() -> None:
    assert parse_unique_id("04a1c2d3e4f50617\n") == "04a1c2d3e4f50617"
    assert parse_unique_id("4a1c2d3e4f50617\n") == "04a1c2d3e4f50617"  # serial_number fallback, %llx
    assert parse_unique_id("ABCDEF\n") == "0000000000abcdef"
    # no id: an SR-IOV VF's unique_id reads empty (the kernel prints nothing for 0), or zeros
    assert parse_unique_id("") == parse_unique_id("\n") == parse_unique_id("0000000000000000\n") == ""
    for bad in ("0x4a1c\n", "12345678901234567\n", "xyz\n", "4a1c 2d3e\n"):
        with pytest.raises(TextParseError):
            parse_unique_id(bad)


def test_hex_id() -> None:
    assert parse_hex_id("0x1002\n") == "0x1002"
    assert parse_hex_id("0x740C\n") == "0x740c"
    assert parse_hex_id("0x01\n") == "0x01"  # revision keeps its width
    for bad in ("1002\n", "", "0x\n", "0x10 02\n"):
        with pytest.raises(TextParseError):
            parse_hex_id(bad)


# pcie_bw -------------------------------------------------------------------------------------------


def test_pcie_bw() -> None:
    bw = parse_pcie_bw("2718 3141 256\n")
    assert bw == PcieBw(received=2718, sent=3141, max_payload_bytes=256)
    assert bw.estimate_bytes_per_second() == (2718 + 3141) * 256
    for bad in ("", "1 2\n", "1 2 3\n", "1 2 16384\n", "-1 2 256\n", "a b c\n", "1 2 256 4\n"):
        with pytest.raises(TextParseError):
            parse_pcie_bw(bad)


# key/value files -----------------------------------------------------------------------------------


def test_kfd_properties() -> None:
    text = (
        "cpu_cores_count 0\nsimd_count 440\nlocation_id 49408\ndomain 0\n"
        "hive_id 12345678901234567890\nsimd_arrays_per_engine 1\narray_count 8\ncu_per_simd_array 14\n"
    )
    props = parse_key_values(text)
    assert props["location_id"] == 0xC1 << 8
    assert props["hive_id"] == 12345678901234567890
    assert len(props) == 8


def test_kfd_io_link_properties() -> None:
    props = parse_key_values("type 11\nversion_major 0\nnode_from 2\nnode_to 3\nweight 15\n")
    assert props == {"type": 11, "version_major": 0, "node_from": 2, "node_to": 3, "weight": 15}


def test_key_values_rejects() -> None:
    for bad in ("type\n", "type -1\n", "type 1\ntype 2\n", "type 1 2\n", "ty pe 1\n", "weight 1.5\n"):
        with pytest.raises(TextParseError):
            parse_key_values(bad)
    assert parse_key_values("") == {}


def test_uevent() -> None:
    text = (
        "DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_ID=1002:740C\nPCI_SUBSYS_ID=1002:0B0C\n"
        "PCI_SLOT_NAME=0000:c1:00.0\nMODALIAS=pci:v00001002d0000740Csv00001002sd00000B0Cbc03sc80i00\n"
    )
    values = parse_uevent(text)
    assert values["DRIVER"] == "amdgpu"
    assert values["PCI_SLOT_NAME"] == "0000:c1:00.0"
    assert len(values) == 6
    assert parse_uevent("") == {}
    for bad in ("DRIVER\n", "=amdgpu\n", "DRIVER=a\nDRIVER=b\n", "DRIVER=amd\x00gpu\n"):
        with pytest.raises(TextParseError):
            parse_uevent(bad)


# words ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auto\n", "auto"),
        ("perf_determinism\n", "perf_determinism"),
        ("SPX\n", "SPX"),
        ("NPS1\n", "NPS1"),
        ("type : oam\n", "oam"),
        ("type : cem\n", "cem"),
        ("junction\n", "junction"),
        ("113-D65201-042\n", "113-D65201-042"),
        ("0000:c1:00.0\n", "0000:c1:00.0"),  # a colon inside a word is not a label
    ],
)
def test_word(text: str, expected: str) -> None:
    assert parse_word(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "two words\n", "type : two words\n", "a\nb\n", "au\x00to\n", "autö\n"])
def test_word_rejects(text: str) -> None:
    with pytest.raises(TextParseError):
        parse_word(text)


def test_bytes_are_accepted_and_bad_input_types_are_parse_errors() -> None:
    assert parse_unsigned(b"42\n") == 42
    assert parse_word(bytearray(b"auto\n")) == "auto"  # type: ignore[arg-type]
    with pytest.raises(TextParseError):
        parse_unsigned(b"\xff\xfe")
    for wrong in (None, 42, 4.2):
        with pytest.raises(TextParseError):
            parse_unsigned(wrong)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# Properties: any input gives a value or a TextParseError, and values satisfy each parser's contract
# ---------------------------------------------------------------------------------------------------

_HEX16 = set("0123456789abcdef")


def _check_dpm(levels: DpmLevels) -> None:
    assert levels.levels_hertz
    assert levels.current_index is None or 0 <= levels.current_index < len(levels.levels_hertz)
    assert all(0 <= hz <= U32_MAX * 1e6 for hz in levels.levels_hertz)
    assert levels.max_hertz == max(levels.levels_hertz)


# parser, and a check that every value it returns must pass
CONTRACTS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], None]]] = {
    "unsigned": (parse_unsigned, lambda v: _assert(isinstance(v, int) and 0 <= v <= U64_MAX)),
    "signed": (parse_signed, lambda v: _assert(isinstance(v, int) and I64_MIN <= v <= I64_MAX)),
    "percent": (parse_percent_ratio, lambda v: _assert(0.0 <= v <= 1.0)),
    "scaled": (lambda t: parse_scaled(t, 1e-3), lambda v: _assert(isinstance(v, float))),
    "pp_dpm": (parse_pp_dpm, _check_dpm),
    "link_speed": (parse_link_speed, lambda v: _assert(v > 0)),
    "link_width": (parse_link_width, lambda v: _assert(v in {0, 1, 2, 4, 8, 12, 16, 32})),
    "ras_err_count": (
        parse_ras_err_count,
        lambda v: _assert(v.correctable >= 0 and v.uncorrectable >= 0 and (v.deferred or 0) >= 0),
    ),
    "bad_page_statuses": (parse_bad_pages, lambda v: _assert(v.retired >= 0 and v.pending >= 0)),
    "aer_total": (lambda t: parse_aer_total(t, "fatal"), lambda v: _assert(0 <= v <= U64_MAX)),
    "devcoredump_time": (parse_devcoredump_time, lambda v: _assert(0 <= v < 1e13)),
    "fw_version": (parse_fw_version, lambda v: _assert(len(v) == 10 and v[:2] == "0x" and set(v[2:]) <= _HEX16)),
    "unique_id": (parse_unique_id, lambda v: _assert(v == "" or (len(v) == 16 and set(v) <= _HEX16 and v != "0" * 16))),
    "pcie_bw": (parse_pcie_bw, lambda v: _assert(v.estimate_bytes_per_second() >= 0)),
    "key_values": (parse_key_values, lambda v: _assert(all(0 <= x <= U64_MAX for x in v.values()))),
    "uevent": (parse_uevent, lambda v: _assert(all(k and "=" not in k and "\n" not in x for k, x in v.items()))),
    "word": (parse_word, lambda v: _assert(bool(v) and not any(c.isspace() for c in v))),
    "hex_id": (parse_hex_id, lambda v: _assert(v.startswith("0x") and set(v[2:]) <= _HEX16)),
}


def _assert(condition: bool) -> None:
    assert condition


def _value_or_parse_error(name: str, data: str | bytes) -> None:
    parser, contract = CONTRACTS[name]
    try:
        value = parser(data)
    except TextParseError:
        return
    contract(value)


# Pieces of the real formats, so generated text gets past the first character of each grammar.
_FRAGMENTS = [
    "0", "1", "2", "9", "16", "37", "100", "255", "4294967295", "4294967296", "18446744073709551615",
    "18446744073709551616", "-", "+", ".", ":", " : ", " ", "\t", "\n", "\r", "\x00", "é", "*",
    "S", "F", "Mhz", "MHz", "GT/s", "GT/s,", " GT/s PCIe", ",", ", ", "x", "x16", "PCIe", "ue", "ce",
    "de", "ue: ", "ce: ", "de: ", "0x", "ff", "0000001a", "R", "P", "=", "DRIVER", "type", "_", "a",
    "unavailable", "Unknown", "Query currently inaccessible", "feature mask: ",
]  # fmt: skip
near_formats = st.lists(st.sampled_from(_FRAGMENTS), max_size=24).map("".join)


# Arbitrary text, arbitrary bytes, and (twice as often) text built from the formats' own pieces.
any_input = st.one_of(st.text(), st.binary(), near_formats, near_formats)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
@given(data=any_input)
def test_any_input_gives_value_or_parse_error(name: str, data: str | bytes) -> None:
    _value_or_parse_error(name, data)


# ---------------------------------------------------------------------------------------------------
# Round trips: format the kernel's way, parse it back
# ---------------------------------------------------------------------------------------------------

surrounding_space = st.sampled_from(["", "\n", " ", "\n\n", " \t"])


@given(value=st.integers(0, U64_MAX), before=surrounding_space, after=surrounding_space)
def test_unsigned_round_trip(value: int, before: str, after: str) -> None:
    assert parse_unsigned(f"{before}{value}\n{after}") == value


@given(value=st.integers(U64_MAX + 1, 2**80))
def test_unsigned_rejects_past_u64(value: int) -> None:
    with pytest.raises(TextParseError):
        parse_unsigned(f"{value}\n")


@given(value=st.integers(I64_MIN, I64_MAX))
def test_signed_round_trip(value: int) -> None:
    assert parse_signed(f"{value}\n") == value


@given(percent=st.integers(-(2**31), 2**31 - 1))
def test_percent_round_trip(percent: int) -> None:
    if 0 <= percent <= 100:
        assert parse_percent_ratio(f"{percent}\n") == percent / 100
    else:
        with pytest.raises(TextParseError):
            parse_percent_ratio(f"{percent}\n")


@given(value=st.integers(-(2**31), 2**32 - 1), unit=st.sampled_from([(1e-3, 1000), (1e-6, 1_000_000), (1, 1)]))
def test_scaled_round_trip(value: int, unit: tuple[float, int]) -> None:
    scale, divisor = unit
    assert parse_scaled(f"{value}\n", scale) == value / divisor


mhz = st.integers(0, U32_MAX)


@given(
    levels=st.lists(mhz, min_size=1, max_size=16),
    current=st.integers(0, 15) | st.none(),
    deep_sleep=st.none() | mhz,
    smu_cmn_numbering=st.booleans(),
)
def test_pp_dpm_round_trip(
    levels: list[int], current: int | None, deep_sleep: int | None, smu_cmn_numbering: bool
) -> None:
    if current is not None:
        current %= len(levels)
    lines = []
    first = 0
    if deep_sleep is not None:
        lines.append(f"S: {deep_sleep}Mhz *\n")
        current = None  # no level is marked while the clock sleeps
        first = 1 if smu_cmn_numbering else 0
    for i, value in enumerate(levels):
        lines.append(f"{first + i}: {value}Mhz {'*' if i == current else ''}\n")
    parsed = parse_pp_dpm("".join(lines))
    assert parsed.levels_hertz == tuple(v * 1e6 for v in levels)
    assert parsed.current_index == current
    assert parsed.deep_sleep_hertz == (None if deep_sleep is None else deep_sleep * 1e6)
    expected_current = (
        deep_sleep * 1e6 if deep_sleep is not None else None if current is None else levels[current] * 1e6
    )
    assert parsed.current_hertz == expected_current
    assert parsed.max_hertz == max(levels) * 1e6


@given(
    speed=st.sampled_from(
        [
            ("2.5 GT/s PCIe", 2.5e9),
            ("5.0 GT/s PCIe", 5e9),
            ("8.0 GT/s PCIe", 8e9),
            ("16.0 GT/s PCIe", 16e9),
            ("32.0 GT/s PCIe", 32e9),
            ("64.0 GT/s PCIe", 64e9),
            ("2.5 GT/s", 2.5e9),
            ("5 GT/s", 5e9),
            ("8 GT/s", 8e9),
            ("16 GT/s", 16e9),
        ]
    ),
    after=surrounding_space,
)
def test_link_speed_every_kernel_string(speed: tuple[str, float], after: str) -> None:
    text, rate = speed
    assert parse_link_speed(f"{text}\n{after}") == rate


@given(width=st.sampled_from([0, 1, 2, 4, 8, 12, 16, 32]))
def test_link_width_round_trip(width: int) -> None:
    assert parse_link_width(f"{width}\n") == width


@given(ue=st.integers(0, U64_MAX), ce=st.integers(0, U64_MAX), de=st.none() | st.integers(0, U64_MAX))
def test_ras_err_count_round_trip(ue: int, ce: int, de: int | None) -> None:
    text = f"ue: {ue}\nce: {ce}\n" + ("" if de is None else f"de: {de}\n")
    assert parse_ras_err_count(text) == RasCounts(correctable=ce, uncorrectable=ue, deferred=de)


@given(st.lists(st.tuples(st.integers(0, U32_MAX), st.integers(0, U32_MAX), st.sampled_from("RPF")), max_size=20))
def test_bad_pages_round_trip(records: list[tuple[int, int, str]]) -> None:
    text = "".join(f"0x{page:08x} : 0x{size:08x} : {flag}\n" for page, size, flag in records)
    assert parse_bad_pages(text).retired == sum(1 for *_, flag in records if flag == "R")


@given(version=st.integers(0, U32_MAX), upper=st.booleans())
def test_fw_version_round_trip(version: int, upper: bool) -> None:
    text = f"0x{version:08x}\n"
    assert parse_fw_version(text.upper().replace("0X", "0x") if upper else text) == f"0x{version:08x}"
    assert parse_fw_version(f"0x{version:x}\n") == f"0x{version:08x}"


@given(uid=st.integers(0, U64_MAX))
def test_unique_id_round_trip(uid: int) -> None:
    expected = f"{uid:016x}" if uid else ""  # 0 is no id
    assert parse_unique_id(f"{uid:016x}\n") == expected
    assert parse_unique_id(f"{uid:x}\n") == expected  # serial_number's unpadded fallback


@given(received=st.integers(0, U64_MAX), sent=st.integers(0, U64_MAX), mps_shift=st.integers(0, 5))
def test_pcie_bw_round_trip(received: int, sent: int, mps_shift: int) -> None:
    mps = 128 << mps_shift
    bw = parse_pcie_bw(f"{received} {sent} {mps}\n")
    assert bw == PcieBw(received, sent, mps)
    assert bw.estimate_bytes_per_second() == float((received + sent) * mps)


names = st.from_regex(r"[a-z_][a-z0-9_]{0,23}", fullmatch=True)


@given(props=st.dictionaries(names, st.integers(0, U64_MAX), max_size=30))
def test_key_values_round_trip(props: dict[str, int]) -> None:
    assert parse_key_values("".join(f"{k} {v}\n" for k, v in props.items())) == props


@given(
    values=st.dictionaries(
        st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True),
        st.from_regex(r"[!-~]([ -~]{0,30}[!-~])?", fullmatch=True) | st.just(""),
        max_size=10,
    )
)
def test_uevent_round_trip(values: dict[str, str]) -> None:
    assert parse_uevent("".join(f"{k}={v}\n" for k, v in values.items())) == values


words = st.from_regex(r"[!-~]{1,24}", fullmatch=True)


@given(word=words)
def test_word_round_trip(word: str) -> None:
    assert parse_word(f"{word}\n") == word
    assert parse_word(f"type : {word}\n") == word


@given(value=st.integers(0, 0xFFFF))
def test_hex_id_round_trip(value: int) -> None:
    assert parse_hex_id(f"0x{value:04x}\n") == f"0x{value:04x}"
    assert parse_hex_id(f"0x{value:04X}\n") == f"0x{value:04x}"
