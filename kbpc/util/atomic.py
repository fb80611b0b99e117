"""Atomic file writes: write a temporary file beside the target, then rename over it (or link it
into place only if the name is free), so a failed or interrupted write never leaves a partial
output behind. Output files get ordinary permissions (0644 less the umask); private keys ask for
0600."""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator

from kbpc.errors import KbpcError


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


@contextlib.contextmanager
def _temp_beside(path: Path, mode: str, perms: int) -> Iterator[tuple[IO, str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, perms & ~_umask())
        with os.fdopen(fd, mode) as fh:
            yield fh, tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "wb", perms: int = 0o644) -> Iterator[IO]:
    """A file object whose content replaces `path` only when the block ends without an error."""
    path = Path(path)
    with _temp_beside(path, mode, perms) as (fh, tmp):
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
    with _temp_beside(path, "wb", perms) as (fh, tmp):
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
