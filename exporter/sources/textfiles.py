"""Pure parsers for the text files the sysfs source reads (amdgpu, hwmon, PCI core, KFD topology).

Each parser takes the file's content (str, or the raw bytes of a read) and returns a value in SI base
units, or raises TextParseError with a message that quotes what it saw. Nothing else escapes: a
parser is never the reason a poll cycle dies. The formats are the kernel's own (amdgpu_pm.c,
smu_cmn.c / *_ppt.c, amdgpu_ras.c, drivers/pci, kfd_topology.c); where kernels differ, every
variant seen upstream is accepted and anything else is rejected.

Strict on purpose: the real library reads gpu_busy_percent "abc" as 0 % and mem_info "-5" as
18446744073709551611. Here garbage is an error, surrounding whitespace is not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar


class TextParseError(ValueError):
    """The file's text is not in the format its kernel writer produces."""


class TextUnavailableError(TextParseError):
    """The driver answered, but with its "no value right now" text ("unavailable" after a RAS
    interrupt, "Query currently inaccessible" during reset, "Unknown" link speed). Transient, not
    malformed: a caller may count it differently from garbage."""


U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1
I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

T = TypeVar("T")

# Only ASCII whitespace is "surrounding whitespace": str.strip() would also eat U+0085, U+00A0 ...
_ASCII_SPACE = " \t\n\r\v\f"
_LINE_SPACE = " \t\r"
_MHZ = 1e6
_GIGA = Decimal(10**9)
# Widths a PCIe link can train to; 0 = link down. Anything else (63 = config space read all-ones
# after the device fell off the bus) is not a width.
_PCIE_WIDTHS = frozenset({0, 1, 2, 4, 8, 12, 16, 32})


def _fail(what: str, text: str) -> TextParseError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return TextParseError(f"{what}: {shown!r}")


def _stripped(text: str | bytes) -> str:
    """The str of a text read or the UTF-8 bytes of a binary one, without surrounding whitespace;
    anything else is an error."""
    if isinstance(text, bytes | bytearray):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TextParseError(f"not UTF-8 text: {raw[:60]!r}") from None
    elif not isinstance(text, str):
        raise TextParseError(f"expected str or bytes, got {type(text).__name__}")
    return text.strip(_ASCII_SPACE)


def _lines(text: str) -> list[str]:
    """Non-empty content split into lines with per-line blanks trimmed; an empty line inside the
    content is malformed (no kernel writer emits one)."""
    if not text:
        return []
    lines = [line.strip(_LINE_SPACE) for line in text.split("\n")]
    if any(not line for line in lines):
        raise _fail("blank line inside the file", text)
    return lines


def _match(pattern: re.Pattern[str], text: str, what: str) -> re.Match[str]:
    match = pattern.fullmatch(text)
    if match is None:
        raise _fail(what, text)
    return match


def _keyed_lines(
    text: str, pattern: re.Pattern[str], what: str, key_what: str, value: Callable[[str], T]
) -> dict[str, T]:
    """Lines of `pattern`, groups (key, value) -> {key: value(its text)}; a value must be printable
    and a key given twice is malformed."""
    values: dict[str, T] = {}
    for line in _lines(text):
        match = pattern.fullmatch(line)
        if match is None or not match.group(2).isprintable():
            raise _fail(what, line)
        key = match.group(1)
        if key in values:
            raise _fail(f"{key_what} {key!r} appears twice", text)
        values[key] = value(match.group(2))
    return values


def _counter(what: str) -> Callable[[str], int]:
    return lambda digits: _decimal(digits, 0, U64_MAX, what)


_DECIMAL = re.compile(r"(-?)([0-9]+)")


def _decimal(text: str, low: int, high: int, what: str) -> int:
    number = text
    # The common case, plain ASCII digits, skips the regex: a poll parses several per device.
    if not (0 < len(text) <= 20 and text.isascii() and text.isdigit()):
        match = _DECIMAL.fullmatch(text)
        if match is None:
            raise _fail(f"not a decimal {what}", text)
        sign, digits = match.groups()
        digits = digits.lstrip("0") or "0"
        # u64/i64 need at most 20 digits; checking length first keeps int() away from huge strings.
        if len(digits) > 20:
            raise _fail(f"{what} out of range", text)
        number = sign + digits
    value = int(number)
    if not low <= value <= high:
        raise _fail(f"{what} out of range [{low}, {high}]", text)
    return value


def parse_unsigned(text: str | bytes) -> int:
    """`%u` / `%llu` files (mem_info_*, pcie_replay_count, xgmi_error, ...): 0 .. 2^64-1."""
    return _decimal(_stripped(text), 0, U64_MAX, "unsigned integer")


def parse_signed(text: str | bytes) -> int:
    """`%d` / `%lld` files: -2^63 .. 2^63-1."""
    return _decimal(_stripped(text), I64_MIN, I64_MAX, "signed integer")


def parse_percent_ratio(text: str | bytes) -> float:
    """gpu_busy_percent / mem_busy_percent (`%d\\n`, percent) -> ratio 0..1."""
    stripped = _stripped(text)
    value = _decimal(stripped, I64_MIN, I64_MAX, "percentage")
    if not 0 <= value <= 100:
        raise _fail("percentage outside 0..100", stripped)
    return value / 100


def parse_scaled(text: str | bytes, scale: float) -> float:
    """A hwmon integer times its unit: millidegC 1e-3, uW 1e-6, mV 1e-3, Hz 1.

    hwmon writes `%d` or `%u`/`%llu`, so the range is -2^63 .. 2^64-1. For scales that are 1/N the
    value is divided by N, which rounds correctly (45123 * 1e-3 would not give 45.123 exactly).
    """
    if not (isinstance(scale, int | float) and math.isfinite(scale) and scale != 0):
        raise TextParseError(f"scale must be a finite non-zero number, got {scale!r}")
    value = _decimal(_stripped(text), I64_MIN, U64_MAX, "integer")
    if abs(scale) < 1:
        divisor = round(1 / scale)
        if divisor != 0 and 1 / divisor == scale:
            return value / divisor
    return value * float(scale)


# ---- pp_dpm_{sclk,mclk,socclk,fclk,vclk,dclk,dcefclk} ------------------------------------------

_DPM_LEVEL = re.compile(r"([0-9]{1,3}):[ \t]*([0-9]{1,10})[ \t]*[Mm][Hh][Zz][ \t]*(\*?)")
# S: the clock is in deep sleep, below the lowest level; F: proposed for fine-grained tables, the
# exact current clock. Either is the first line and carries the current clock.
_DPM_PREFIX = re.compile(r"([SF]):[ \t]*([0-9]{1,10})[ \t]*[Mm][Hh][Zz][ \t]*(\*?)")


@dataclass(frozen=True, slots=True)
class DpmLevels:
    """A pp_dpm_* clock table. levels_hertz in file order; current_index is the position (not the
    printed number) of the first level marked `*`; deep_sleep_hertz from an `S:` line;
    fine_grained_hertz from an `F:` line."""

    levels_hertz: tuple[float, ...]
    current_index: int | None
    deep_sleep_hertz: float | None
    fine_grained_hertz: float | None = None

    @property
    def current_hertz(self) -> float | None:
        """The clock right now: the S:/F: line when present (it is the measured clock), else the
        marked level, else None (no level marked, which older kernels do between levels)."""
        marked = None if self.current_index is None else self.levels_hertz[self.current_index]
        return next((hz for hz in (self.deep_sleep_hertz, self.fine_grained_hertz, marked) if hz is not None), None)

    @property
    def max_hertz(self) -> float:
        return max(self.levels_hertz)


def _mhz(digits: str, text: str) -> float:
    value = int(digits)
    if value > U32_MAX:
        raise _fail("clock out of range for %u MHz", text)
    return value * _MHZ


def parse_pp_dpm(text: str | bytes) -> DpmLevels:
    """`%d: %uMhz %s\\n` per level, `*` on the current one; an optional first `S: NMhz *` (deep
    sleep; levels then number from 0 or, in smu_cmn's writer, from 1); `unavailable` after a RAS
    interrupt raises TextUnavailableError. Aldebaran may mark two levels within 25 MHz of the clock."""
    stripped = _stripped(text)
    if stripped.lower() == "unavailable":
        raise TextUnavailableError("pp_dpm table unavailable (RAS interrupt)")
    lines = _lines(stripped)
    if not lines:
        raise _fail("empty clock table", stripped)

    current_line: dict[str, float] = {}  # the clock of an S: or F: line, by its letter
    prefix = _DPM_PREFIX.fullmatch(lines[0])
    if prefix is not None:
        current_line[prefix.group(1)] = _mhz(prefix.group(2), stripped)
        lines = lines[1:]
        if not lines:
            raise _fail(f"{prefix.group(1)}: line without clock levels", stripped)

    levels: list[float] = []
    current: int | None = None
    first_number: int | None = None
    for line in lines:
        match = _match(_DPM_LEVEL, line, "not a clock level line")
        number = int(match.group(1))
        if first_number is None:
            first_number = number
            allowed = (0, 1) if prefix is not None else (0,)
            if number not in allowed:
                raise _fail("clock levels do not start at level 0", stripped)
        elif number != first_number + len(levels):
            raise _fail("clock levels are not numbered consecutively", stripped)
        if match.group(3) and current is None:
            current = len(levels)
        levels.append(_mhz(match.group(2), stripped))
    return DpmLevels(tuple(levels), current, current_line.get("S"), current_line.get("F"))


# ---- PCI core: current_link_speed / max_link_speed / *_link_width -------------------------------

_LINK_SPEED = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,2})?)[ \t]*GT/s(?:[ \t]+PCIe)?")


def parse_link_speed(text: str | bytes) -> float:
    """`16.0 GT/s PCIe` (pci_speed_string), `16 GT/s` (kernels before 4.17) -> 16e9 T/s.
    `Unknown` / `Unknown speed` raise TextUnavailableError; PCI-X and AGP strings are rejected."""
    stripped = _stripped(text)
    if stripped in ("Unknown", "Unknown speed"):
        raise TextUnavailableError(f"link speed unknown: {stripped!r}")
    value = Decimal(_match(_LINK_SPEED, stripped, "not a PCIe link speed").group(1))
    if value <= 0:
        raise _fail("link speed must be positive", stripped)
    return float(value * _GIGA)


def parse_link_width(text: str | bytes) -> int:
    """`%u\\n` lanes; 0 = link down. Values no link can have are rejected."""
    stripped = _stripped(text)
    width = _decimal(stripped, 0, U32_MAX, "link width")
    if width not in _PCIE_WIDTHS:
        raise _fail("not a PCIe link width", stripped)
    return width


# ---- RAS -------------------------------------------------------------------------------------------

_RAS_COUNT = re.compile(r"(ue|ce|de):[ \t]*([0-9]+)")


@dataclass(frozen=True, slots=True)
class RasCounts:
    """ras/<block>_err_count: cumulative since driver load. deferred is None without a `de:` line."""

    correctable: int
    uncorrectable: int
    deferred: int | None


def parse_ras_err_count(text: str | bytes) -> RasCounts:
    """`ue: %lu\\nce: %lu\\n` (+ `de: %lu\\n` on newer kernels); `Query currently inaccessible`
    (not ready, or a reset is under way) raises TextUnavailableError."""
    stripped = _stripped(text)
    if stripped == "Query currently inaccessible":
        raise TextUnavailableError("RAS error count query currently inaccessible")
    counts = _keyed_lines(stripped, _RAS_COUNT, "not a RAS count line", "RAS count", _counter("error count"))
    if "ue" not in counts or "ce" not in counts:
        raise _fail("RAS error count needs both ue: and ce:", stripped)
    return RasCounts(correctable=counts["ce"], uncorrectable=counts["ue"], deferred=counts.get("de"))


_BAD_PAGE = re.compile(r"0[xX]([0-9a-fA-F]{1,16})[ \t]*:[ \t]*0[xX]([0-9a-fA-F]{1,16})[ \t]*:[ \t]*([RPF])")


@dataclass(frozen=True, slots=True)
class BadPages:
    retired: int  # R: reserved, never used again
    pending: int  # P: found bad, to be reserved (at the next reset)


def parse_bad_pages(text: str | bytes) -> BadPages:
    """`0x%08x : 0x%08x : %1s\\n` per record (page frame, size, status; an empty file means no bad
    pages) -> how many are retired (R) and pending (P); faulted (F) records, whose reservation
    failed, are valid but counted in neither."""
    records = [_match(_BAD_PAGE, line, "not a bad page record") for line in _lines(_stripped(text))]
    statuses = [record.group(3) for record in records]
    return BadPages(retired=statuses.count("R"), pending=statuses.count("P"))


# The driver's bad-page table lives in an EEPROM: 256 KiB of 24-byte records after its header
# (RAS_MAX_RECORD_COUNT, about 10,900; the v2.1 table a few less). No board can list more pages than
# that; the bound here leaves room above it. A record line is at most `0x` + 16 hex digits twice, the
# separators, the flag and its newline.
BAD_PAGE_RECORDS_MAX = 16384
BAD_PAGE_LINE_MAX_BYTES = 2 + 16 + 3 + 2 + 16 + 3 + 1 + 1
BAD_PAGES_MAX_BYTES = BAD_PAGE_RECORDS_MAX * BAD_PAGE_LINE_MAX_BYTES


class BadPageCount:
    """ras/gpu_vram_bad_pages counted as it streams in, line by line: only the unfinished last line is
    held, never the file. Each line that is not a record is one bad line, counted and skipped; the
    records before and after it still count. More records than the EEPROM can hold is an error of the
    read (`too_many`): the counts so far are then not the table's."""

    __slots__ = ("_tail", "bad_lines", "first_bad", "pending", "records", "retired")

    def __init__(self) -> None:
        self._tail = b""
        self.retired = 0
        self.pending = 0
        self.records = 0
        self.bad_lines = 0
        self.first_bad = ""  # the first bad line, as read (for the error's detail)

    @property
    def too_many(self) -> bool:
        return self.records > BAD_PAGE_RECORDS_MAX

    def feed(self, chunk: bytes) -> None:
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > BAD_PAGE_LINE_MAX_BYTES:  # no record is that long: a bad line, not kept whole
            self._line(self._tail)
            self._tail = b""
        for line in lines:
            self._line(line)

    def finish(self) -> BadPages:
        if self._tail:
            self._line(self._tail)
            self._tail = b""
        return BadPages(retired=self.retired, pending=self.pending)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("ascii", errors="replace").strip(_LINE_SPACE)
        if not text:
            return
        match = _BAD_PAGE.fullmatch(text)
        if match is None:
            self.bad_lines += 1
            if not self.first_bad:
                self.first_bad = text[:80]
            return
        self.records += 1
        status = match.group(3)
        if status == "R":
            self.retired += 1
        elif status == "P":
            self.pending += 1


# ---- PCIe AER counters (drivers/pci/pcie/aer.c) -----------------------------------------------------

_AER_LINE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)[ \t]+([0-9]+)")
AER_TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}


def parse_aer_total(text: str | bytes, severity: str) -> int:
    """aer_dev_correctable / _nonfatal / _fatal: `<error bit> %llu\\n` lines, then `TOTAL_ERR_<sev> %llu`
    -> that total (the errors of `severity` since boot; the total counts every bit, named or not)."""
    counts = _keyed_lines(_stripped(text), _AER_LINE, "not an 'error count' line", "AER counter", _counter("count"))
    total = AER_TOTALS[severity]
    if total not in counts:
        raise _fail(f"no {total} line", _stripped(text))
    return counts[total]


# ---- a device coredump's head (amdgpu_dev_coredump.c) ----------------------------------------------

_COREDUMP_TITLE = "**** AMDGPU Device Coredump ****"
_COREDUMP_TIME = re.compile(r"time:[ \t]*([0-9]{1,12})\.([0-9]{9})")


def parse_devcoredump_time(text: str | bytes) -> float:
    """The head of an amdgpu devcoredump `data` -> its `time: %lld.%09ld` (CLOCK_MONOTONIC seconds of
    the reset: seconds since boot, not a date). Another driver's dump is not ours to read."""
    # Not _stripped: the line after `time:` carries the task's comm, which any user sets (any bytes,
    # cut mid-character at 15): every byte that is not UTF-8 becomes U+FFFD, and only the title and
    # the time line must be as the driver writes them. The header ends at the first blank line; a
    # read of the file's head may end mid-line after it.
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", errors="replace")
    elif not isinstance(text, str):
        raise TextParseError(f"expected str or bytes, got {type(text).__name__}")
    head = text.strip(_ASCII_SPACE).split("\n\n", 1)[0]
    lines = [line.strip(_LINE_SPACE) for line in head.split("\n") if line.strip(_LINE_SPACE)]
    if not lines or lines[0] != _COREDUMP_TITLE:
        raise _fail("not an amdgpu device coredump", lines[0] if lines else "")
    for line in lines[1:8]:  # the header: version, kernel, module, time
        match = _COREDUMP_TIME.fullmatch(line)
        if match is not None:
            return int(match.group(1)) + int(match.group(2)) / 1e9
    raise _fail("no time: line in the coredump header", " | ".join(lines[:8]))


# ---- identity: firmware, unique_id, PCI ids --------------------------------------------------------

_FW_VERSION = re.compile(r"0[xX]([0-9a-fA-F]{1,8})")
_UNIQUE_ID = re.compile(r"[0-9a-fA-F]{1,16}")
_HEX_ID = re.compile(r"0[xX]([0-9a-fA-F]{1,16})")


def parse_fw_version(text: str | bytes) -> str:
    """fw_version/*_fw_version `0x%08x\\n` -> "0x0000001a" (8 lower-case hex digits)."""
    match = _match(_FW_VERSION, _stripped(text), "not a 32-bit firmware version")
    return f"0x{int(match.group(1), 16):08x}"


def parse_unique_id(text: str | bytes) -> str:
    """unique_id `%016llx\\n` (or the unpadded `%llx` of the serial fallback) -> 16 lower-case hex;
    "" for no id: the kernel prints nothing when the id is 0 (an SR-IOV VF's), and 0 is no id either."""
    stripped = _stripped(text)
    if not stripped:
        return ""
    value = int(_match(_UNIQUE_ID, stripped, "not a 64-bit hex id").group(), 16)
    return f"{value:016x}" if value else ""


def parse_hex_id(text: str | bytes) -> str:
    """PCI vendor/device/subsystem/revision `0x%04x\\n` -> "0x1002" (lower case, width kept)."""
    return "0x" + _match(_HEX_ID, _stripped(text), "not a 0x-prefixed hex id").group(1).lower()


# ---- pcie_bw ---------------------------------------------------------------------------------------

_PCIE_BW = re.compile(r"([0-9]+)[ \t]+([0-9]+)[ \t]+(-?[0-9]+)")
# pcie_get_mps(): 128 << (DEVCTL payload field); 128..4096 are the values PCIe defines.
_MAX_PAYLOAD_SIZES = frozenset(128 << n for n in range(6))


@dataclass(frozen=True, slots=True)
class PcieBw:
    """pcie_bw: message counts over the 1 s the read sleeps, and the max payload size."""

    received: int
    sent: int
    max_payload_bytes: int

    def estimate_bytes_per_second(self) -> float:
        """Upper bound: every message counted as a full payload, over the driver's 1 s window."""
        return float((self.received + self.sent) * self.max_payload_bytes)


def parse_pcie_bw(text: str | bytes) -> PcieBw:
    """`%llu %llu %i\\n`: received messages, posted requests sent, max payload size in bytes."""
    stripped = _stripped(text)
    match = _match(_PCIE_BW, stripped, "not a pcie_bw triple")
    received = _decimal(match.group(1), 0, U64_MAX, "counter")
    sent = _decimal(match.group(2), 0, U64_MAX, "counter")
    mps = _decimal(match.group(3), I64_MIN, I64_MAX, "payload size")
    if mps not in _MAX_PAYLOAD_SIZES:
        raise _fail("max payload size is not 128..4096 bytes", stripped)
    return PcieBw(received=received, sent=sent, max_payload_bytes=mps)


# ---- key/value files: KFD properties, uevent --------------------------------------------------------

_KEY_VALUE = re.compile(r"([A-Za-z0-9_]+)[ \t]+([0-9]+)")
_UEVENT = re.compile(r"([A-Za-z0-9_]+)=(.*)")


def parse_key_values(text: str | bytes) -> dict[str, int]:
    """KFD topology `properties` (node, io_link, mem_bank): `%s %u\\n` / `%s %llu\\n` lines."""
    return _keyed_lines(_stripped(text), _KEY_VALUE, "not a 'name value' line", "property", _counter("property value"))


def parse_uevent(text: str | bytes) -> dict[str, str]:
    """`KEY=value\\n` lines (`DRIVER=amdgpu`, `PCI_SLOT_NAME=0000:c1:00.0`); values may be empty."""
    return _keyed_lines(_stripped(text), _UEVENT, "not a KEY=value line", "uevent key", str)


# ---- words and lines -------------------------------------------------------------------------------

_WORD = re.compile(r"[!-~]+")
# board_info writes "%s : %s\n" ("type : oam"); the spaces around ':' tell it from a word with a
# colon in it, such as a PCI address.
_LABELLED_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*[ \t]+:[ \t]+([!-~]+)")


def parse_word(text: str | bytes) -> str:
    """A one-token file (power_dpm_force_performance_level `auto`, current_compute_partition `SPX`,
    hwmon labels, vbios_version) or a labelled token (board_info `type : oam` -> "oam")."""
    stripped = _stripped(text)
    labelled = _LABELLED_WORD.fullmatch(stripped)
    if labelled is not None:
        return labelled.group(1)
    if _WORD.fullmatch(stripped) is None:
        raise _fail("not a single word", stripped)
    return stripped
