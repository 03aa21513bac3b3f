"""Writes files under a root so that no reader ever sees half a value, and only when they change.

Every write goes to a hidden temp file in the same folder and is renamed over the target
(rename is atomic within a filesystem). A per-path cache of the last content written skips
unchanged files, which keeps a 64-GCD tree ticking at 1 Hz cheap.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path


class AtomicTree:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._written: dict[str, bytes] = {}
        self._made_dirs: set[str] = set()
        self.writes = 0  # files actually replaced (for tests and the benchmark)

    def mkdir(self, rel: str) -> None:
        if rel not in self._made_dirs:
            os.makedirs(self.root / rel, exist_ok=True)
            self._made_dirs.add(rel)

    def write(self, rel: str, content: bytes | str) -> bool:
        """Atomically make root/rel hold `content`; returns False when it already did."""
        data = content.encode() if isinstance(content, str) else content
        if self._written.get(rel) == data:
            return False
        folder, _, name = rel.rpartition("/")
        if folder:
            self.mkdir(folder)
        target = os.path.join(self.root, rel)
        # a dot-name never matches the readers' globs (card*, hwmon*, numeric KFD nodes, tempN_*)
        temp = os.path.join(self.root, folder, f".{name}.sim-tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, target)
        self._written[rel] = data
        self.writes += 1
        return True

    def write_files(self, folder: str, files: Mapping[str, bytes | str]) -> None:
        """write() every file of `files` (name -> content) into folder."""
        for name, content in files.items():
            self.write(f"{folder}/{name}", content)

    def symlink(self, rel: str, target_rel: str) -> None:
        """root/rel -> target, written as a relative link (like sysfs) so the tree can be moved or
        bind-mounted over /sys and still resolve."""
        folder = rel.rpartition("/")[0]
        if folder:
            self.mkdir(folder)
        link = self.root / rel
        relative = os.path.relpath(self.root / target_rel, self.root / folder if folder else self.root)
        if link.is_symlink():
            if os.readlink(link) == relative:
                return
            link.unlink()
        os.symlink(relative, link)

    def remove(self, rel: str) -> None:
        """Remove root/rel (a file, a link, or a folder with everything in it) if it is there."""
        path = self.root / rel
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            return
        prefix = f"{rel}/"
        self._written = {
            name: data for name, data in self._written.items() if name != rel and not name.startswith(prefix)
        }
        self._made_dirs = {name for name in self._made_dirs if name != rel and not name.startswith(prefix)}
