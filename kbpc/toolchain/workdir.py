"""Private build folders: each compile works in its own folder under the object cache's tmp/
(sources, objects, the library being linked), removed when the compile ends.

A compile killed outright (kill -9, a power cut) cannot remove its folder, so each folder holds a
`.lock` file that its compile keeps locked (flock) while it runs: the kernel drops the lock when
the process dies, however it dies. The next compile sweeps folders whose lock it can take, and
temporaries no writer holds (kbpc/util/atomic.py), left by a kill in the middle of a write."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from kbpc.util.atomic import remove_if_dead

STALE_SECONDS = 3600     # an unlocked temporary older than this belongs to no running compile
_LOCK = ".lock"


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@contextlib.contextmanager
def build_folder(temp_root: Path) -> Iterator[Path]:
    """A new private folder under `temp_root`, locked while the block runs, removed after it."""
    path = Path(tempfile.mkdtemp(prefix=f"build-{os.getpid()}-", dir=temp_root))
    try:
        with open(path / _LOCK, "wb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _older_than(path: Path, seconds: float) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > seconds
    except FileNotFoundError:
        return False


def remove_if_unused(path: Path, min_age: float = STALE_SECONDS) -> int:
    """Remove a build folder whose lock no process holds, a temporary file no writer holds
    (kbpc/util/atomic.py), or a folder without a lock file older than `min_age` seconds; return
    the bytes freed (0 if it was kept)."""
    if not path.is_dir():
        return remove_if_dead(path)
    lock_path = path / _LOCK
    if lock_path.exists():
        try:
            with open(lock_path, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                size = _size(path)
                shutil.rmtree(path, ignore_errors=True)
                return size
        except (BlockingIOError, FileNotFoundError):
            return 0  # a running compile holds it, or it is gone
    if not _older_than(path, min_age):
        return 0      # being created: its compile has not locked it yet
    size = _size(path)
    shutil.rmtree(path, ignore_errors=True)
    return size


def sweep(folder: Path, min_age: float = STALE_SECONDS) -> int:
    """Remove what killed compiles left in `folder` (build folders, `*.tmp`); the bytes freed."""
    freed = 0
    with contextlib.suppress(FileNotFoundError):
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) or entry.name.endswith(".tmp"):
                    freed += remove_if_unused(Path(entry.path), min_age)
    return freed
