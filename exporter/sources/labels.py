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
    cleaned = _CONTROL.sub("", stripped)
    if len(cleaned) > MAX_LABEL_CHARS:
        cleaned = cleaned[:MAX_LABEL_CHARS]
    return cleaned, cleaned != stripped
