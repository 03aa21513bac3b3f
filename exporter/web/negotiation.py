"""Content negotiation for /metrics: which format and whether gzip, from Accept and Accept-Encoding.

Pure functions over header bytes. A media type or coding with q=0 is refused (RFC 9110 §12.4.2):
prometheus-client's own helpers (choose_encoder, gzip_accepted) match names only and ignore q, so
`Accept-Encoding: gzip;q=0` would still get gzip from them.
"""

from __future__ import annotations

OPENMETRICS = b"application/openmetrics-text"
TEXT = b"text/plain"


def _preferences(header: bytes) -> dict[bytes, float]:
    """b"a;q=0.5, b" -> {b"a": 0.5, b"b": 1.0}; the highest q wins for a name listed twice."""
    found: dict[bytes, float] = {}
    for item in header.split(b","):
        name, *params = item.split(b";")
        name = name.strip().lower()
        if not name:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition(b"=")
            if key.strip().lower() == b"q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0  # a q we cannot read is not a yes
                q = min(max(q, 0.0), 1.0)
        found[name] = max(found.get(name, 0.0), q)
    return found


def wants_openmetrics(accept: bytes) -> bool:
    """OpenMetrics when the client accepts it (q > 0) at least as much as the text format."""
    prefs = _preferences(accept)
    openmetrics = prefs.get(OPENMETRICS, 0.0)
    if openmetrics <= 0.0:
        return False
    text = max(prefs.get(TEXT, 0.0), prefs.get(b"text/*", 0.0), prefs.get(b"*/*", 0.0))
    return openmetrics >= text


def wants_gzip(accept_encoding: bytes) -> bool:
    """gzip when it is accepted with q > 0, by name or through `*` (unless named with q=0)."""
    prefs = _preferences(accept_encoding)
    if b"gzip" in prefs:
        return prefs[b"gzip"] > 0.0
    return prefs.get(b"*", 0.0) > 0.0
