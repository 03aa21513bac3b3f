"""Rewrite the golden /metrics files (review the diff before committing it).

Run `make golden`, or `python tests/golden/regenerate.py` from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.golden.golden_metrics import GOLDEN_FILES, render_golden


def main() -> int:
    rendered = render_golden()
    for openmetrics, path in GOLDEN_FILES.items():
        path.write_text(rendered[openmetrics], encoding="utf-8")
        print(f"wrote {path} ({len(rendered[openmetrics].splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
