"""Atomic file writes: write a temporary file beside the target, then rename over it, so a failed
or interrupted write never leaves a partial output behind.

A process killed outright (kill -9) cannot remove its temporary, which for a full bundle is as
large as the checkpoint. So the writer holds a lock (flock) on its temporary while it writes,
which the kernel releases however the process ends, and each write to a path first removes the
temporaries of earlier writes to that path whose lock nobody holds."""
from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator


# A temporary this young may belong to a writer between creating it and locking it.
_GRACE_SECONDS = 10.0


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_if_dead(tmp: Path, min_age: float = _GRACE_SECONDS) -> int:
    """Remove the temporary `tmp` if no writer holds its lock and it is older than `min_age`
    seconds; return the bytes freed (0 if it was kept)."""
    try:
        with open(tmp, "rb") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)   # fails while its writer lives
            st = os.fstat(fh.fileno())
            if time.time() - st.st_mtime < min_age:
                return 0
            tmp.unlink()
            return st.st_size
    except (BlockingIOError, FileNotFoundError, PermissionError, IsADirectoryError):
        return 0


def sweep_dead_temporaries(path: Path) -> int:
    """Remove temporaries left beside `path` by writers that died; the bytes freed."""
    freed = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        with os.scandir(Path(path).parent) as entries:
            for entry in entries:
                if entry.name.startswith(_temp_prefix(path)) and entry.name.endswith(".tmp"):
                    freed += remove_if_dead(Path(entry.path))
    return freed


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "wb", sweep: bool = True) -> Iterator[IO]:
    """Write `path` through a locked temporary beside it, fsynced and renamed over it. `sweep`:
    first remove dead writers' temporaries of `path` (callers writing many files into one folder
    sweep it once instead)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if sweep:
        sweep_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_writer(path, "w") as fh:
        fh.write(text)
