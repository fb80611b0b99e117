"""The object cache: compiled objects by content key, shared by every compile that names the same
folder (one user's compiles, CI jobs on one runner).

Layout under the cache folder (`--cache-dir`, else `$KBPC_CACHE_DIR/build`, else the user cache):

    obj/<key>.kbo   one entry per object: a header (magic, SHA-256 and size of the object) and then
                    the object's bytes. Written under a temporary name, fsynced and renamed, so an
                    entry is absent or whole whoever wrote it; concurrent writers of one key each
                    rename a whole entry and the last one wins.
    tmp/            private build folders of running compiles (kbpc/toolchain/workdir.py)
    .lock           held while entries are evicted past the size limit

A read checks the recorded hash against the very bytes it returns, so a damaged, truncated or
empty entry is never linked: it is evicted and the object rebuilt. An entry's mtime is its last
use; past the size limit the least recently used entries go.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import platformdirs

from kbpc.settings import environment
from kbpc.errors import KbpcError
from kbpc.util.atomic import atomic_writer
from kbpc.toolchain.workdir import remove_if_unused, sweep

_MAGIC = b"KBPCOBJ1"
_HEADER = struct.Struct("<8s32sQ")      # magic, SHA-256 of the object, its size in bytes
ENTRY_SUFFIX = ".kbo"
_MAX_OBJECT_BYTES = 1 << 31


def cache_root() -> Path:
    """The root of kbpc's caches: $KBPC_CACHE_DIR, else the user cache folder."""
    return environment().cache_dir or Path(platformdirs.user_cache_dir("kbpc"))


def default_object_dir() -> Path:
    return cache_root() / "build"


def run_bundle_dir() -> Path:
    """Where `kbpc run BLUEPRINT.json` keeps the bundles it compiles for the local GPU."""
    return cache_root() / "run"


def _os_error(exc: OSError, path: Path) -> KbpcError:
    # an unusable cache folder is the user's setting (exit 2), not a failed build
    return KbpcError(f"object cache: {exc.strerror or exc} (choose another folder with --cache-dir or "
                      "KBPC_CACHE_DIR)", str(path))


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    entries: int
    bytes: int
    limit: int
    temp_items: int
    temp_bytes: int

    def to_json(self) -> dict:
        return {"root": str(self.root), "entries": self.entries, "bytes": self.bytes, "limit": self.limit,
                "temp_items": self.temp_items, "temp_bytes": self.temp_bytes}


class ObjectCache:
    def __init__(self, root: Path | None = None, limit: int | None = None):
        self.root = Path(root) if root is not None else default_object_dir()
        self.limit = environment().cache_limit if limit is None else limit
        self.objects = self.root / "obj"
        self.temp = self.root / "tmp"
        try:
            self.objects.mkdir(parents=True, exist_ok=True)
            self.temp.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error(exc, self.root) from None

    def _entry(self, key: str) -> Path:
        return self.objects / f"{key}{ENTRY_SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The object stored under `key`, or None (absent, or damaged and now evicted)."""
        path = self._entry(key)
        try:
            with open(path, "rb") as fh:
                raw = fh.read(_HEADER.size + _MAX_OBJECT_BYTES)
                inode = os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _os_error(exc, path) from None
        data = _check_entry(raw)
        if data is None:
            self._evict_if_same(path, inode)
            return None
        with contextlib.suppress(OSError):  # recency for eviction; a read-only cache still serves
            os.utime(path)
        return data

    def store(self, key: str, data: bytes) -> None:
        entry = _HEADER.pack(_MAGIC, hashlib.sha256(data).digest(), len(data)) + data
        try:
            with atomic_writer(self._entry(key), sweep=False) as fh:  # compiles sweep obj/ once
                fh.write(entry)
        except OSError as exc:
            raise _os_error(exc, self.root) from None

    @staticmethod
    def _evict_if_same(path: Path, inode: int) -> None:
        """Remove a damaged entry unless another process has already replaced it."""
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                path.unlink()

    def _entries(self) -> list[tuple[float, int, Path]]:
        found = []
        for path in self.objects.iterdir():   # entries, and objects of the first layout (<key>.o)
            if path.name.startswith("."):        # a write in progress
                continue
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                found.append((st.st_mtime, st.st_size, path))
        return sorted(found)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def trim(self, limit: int | None = None) -> int:
        """Evict least recently used entries until the cache holds at most `limit` bytes (default:
        the cache's limit); returns the bytes freed."""
        limit = self.limit if limit is None else limit
        freed = 0
        try:
            with self._locked():
                entries = self._entries()
                total = sum(size for _, size, _ in entries)
                for _, size, path in entries:
                    if total <= limit:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        freed += size
                    total -= size
        except OSError as exc:
            raise _os_error(exc, self.root) from None
        return freed

    def clean(self) -> int:
        """Remove every entry and every build folder no running compile holds; the bytes freed."""
        freed = self.trim(0)
        for item in list(self.temp.iterdir()):
            freed += remove_if_unused(item)
        shutil.rmtree(self.root / "src", ignore_errors=True)  # sources of the first cache layout
        return freed + sweep(self.objects)

    def info(self) -> CacheInfo:
        entries = self._entries()
        temp = [p for p in self.temp.rglob("*") if p.is_file()]
        return CacheInfo(self.root, len(entries), sum(size for _, size, _ in entries), self.limit,
                         len(list(self.temp.iterdir())), sum(p.stat().st_size for p in temp))


def _check_entry(raw: bytes) -> bytes | None:
    if len(raw) < _HEADER.size:
        return None
    magic, digest, size = _HEADER.unpack_from(raw)
    data = raw[_HEADER.size:]
    if magic != _MAGIC or size != len(data) or size == 0 or hashlib.sha256(data).digest() != digest:
        return None
    return data
