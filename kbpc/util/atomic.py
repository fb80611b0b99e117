"""Atomic file writes: write a temporary file beside the target, then rename over it (or link it
into place only if the name is free), so a failed or interrupted write never leaves a partial
output behind. Output files get ordinary permissions (0644 less the umask); private keys ask for
0600.

A process killed outright (kill -9) cannot remove its temporary, which for a full bundle is as
large as the checkpoint. So the writer holds a lock (flock) on its temporary while it writes,
which the kernel releases however the process ends, and each write to a path first removes the
temporaries of earlier writes to that path whose lock nobody holds."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Iterator

from kbpc.errors import KbpcError

# A temporary this young may belong to a writer between creating it and locking it.
_GRACE_SECONDS = 10.0


@functools.cache
def _umask() -> int:
    """The process umask, read without changing it where Linux allows (threads may be running)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
def _temp_beside(path: Path, mode: str, perms: int, sweep: bool) -> Iterator[tuple[IO, str]]:
    """A locked temporary beside `path` (removed at the end unless renamed or linked away)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if sweep:
        sweep_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, perms & ~_umask())
        with os.fdopen(fd, mode) as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield fh, tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "wb", perms: int = 0o644, sweep: bool = True) -> Iterator[IO]:
    """A file object whose content replaces `path` only when the block ends without an error.
    `sweep`: first remove dead writers' temporaries of `path` (callers writing many files into one
    folder sweep it once instead)."""
    path = Path(path)
    with _temp_beside(path, mode, perms, sweep) as (fh, tmp):
        yield fh
        fh.flush()
        os.fsync(fh.fileno())
        os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_writer(path, "w") as fh:
        fh.write(text)


def create_exclusive(path: Path, data: bytes, perms: int = 0o644) -> bool:
    """Write `data` to `path` only if no file has that name: the complete file appears at once
    (written aside, then hard-linked into place), and a racing writer's file is never replaced.
    True if this call created it."""
    path = Path(path)
    with _temp_beside(path, "wb", perms, sweep=True) as (fh, tmp):
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    return True


def check_writable_dir(path: Path, what: str) -> None:
    """Create `path` if needed and prove a file can be made in it, or raise KbpcError naming it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kbpc-write-check.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise KbpcError(f"cannot write to the {what}: {exc.strerror or exc}", str(path)) from None
