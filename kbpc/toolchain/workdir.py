"""Private build folders: each compile works in its own folder under the object cache's tmp/
(sources, objects, the library being linked), removed when the compile ends.

A compile killed outright (kill -9, a power cut) cannot remove its folder, so each folder holds a
`.lock` file that its compile keeps locked (flock) while it runs: the kernel drops the lock when
the process dies, however it dies. The next compile sweeps folders whose lock it can take, and
temporary files older than an hour (`.<name>.<pid>.tmp`, left by a kill in the middle of a write)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

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
    """Remove a build folder whose lock no process holds, or a temporary file (or a folder without
    a lock file) older than `min_age` seconds; return the bytes freed (0 if it was kept)."""
    lock_path = path / _LOCK
    if path.is_dir() and lock_path.exists():
        try:
            with open(lock_path, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                size = _size(path)
                shutil.rmtree(path, ignore_errors=True)
                return size
        except BlockingIOError:
            return 0  # a running compile holds it
        except FileNotFoundError:
            return 0
    if not _older_than(path, min_age):
        return 0
    with contextlib.suppress(FileNotFoundError):
        size = _size(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
        return size
    return 0


def sweep(folder: Path, min_age: float = STALE_SECONDS) -> int:
    """Remove what killed compiles left in `folder`; the bytes freed."""
    freed = 0
    with contextlib.suppress(FileNotFoundError):
        for item in list(folder.iterdir()):
            if item.is_dir() or item.name.endswith(".tmp"):
                freed += remove_if_unused(item, min_age)
    return freed
