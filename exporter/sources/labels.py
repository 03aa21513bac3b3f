"""Identity strings made safe as label values: bounded in length, no control characters or NUL.

A product_name or serial_number comes from a FRU EEPROM the exporter does not control: a 10 MB or
NUL-laden one must not become a 10 MB label on every series of every scrape.
"""

from __future__ import annotations

import re

MAX_LABEL_CHARS = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def clean_label(text: str) -> tuple[str, bool]:
    """(the text stripped, without control characters, cut to MAX_LABEL_CHARS; whether it had to change)."""
    stripped = text.strip()
    cleaned = _CONTROL.sub("", stripped)[:MAX_LABEL_CHARS]
    return cleaned, cleaned != stripped


_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_./:-]")
MAX_NAME_CHARS = 64


def clean_name(name: str) -> str:
    """A file or directory name used as a label value (firmware block, RAS block, file): a name from a
    listing can hold any byte but '/' and NUL, and one that is not UTF-8 would break rendering."""
    return _NAME_UNSAFE.sub("_", name)[:MAX_NAME_CHARS]
