"""Text a user or a file controls, made safe to carry: a label value, a JSON string, a log field.

json.loads turns the escape `"\\ud800"` into a lone surrogate (Python's own json.dumps writes one for a
Latin-1 name read in a non-UTF-8 environment); such a str cannot be encoded as UTF-8, so it would fail
every /metrics and JSON answer that carried it. Replaced with U+FFFD when read, like invalid UTF-8.
"""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(value: str) -> str:
    """value with every lone surrogate replaced by U+FFFD (a no-op, and cheap, for ordinary text)."""
    if value.isascii():
        return value
    return _SURROGATE.sub("\ufffd", value)


def clean_labels(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """(name, value) pairs with each value cleaned; the same tuple when nothing needed it."""
    if all(value.isascii() for _name, value in labels):
        return labels
    return tuple((name, clean_text(value)) for name, value in labels)
