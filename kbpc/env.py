"""Every environment variable kbpc reads, read here and nowhere else (STYLE.md): each becomes a
field of one frozen record, checked when read, so a bad value is a one-line error naming the
variable rather than a surprise deep inside a pass.

    KBPC_CACHE_DIR         root of kbpc's caches (objects in build/, compiled-on-run bundles in
                           run/); default: the user cache folder (platformdirs)
    KBPC_CACHE_LIMIT       size limit of the object cache, e.g. 2G or 500M (default 5G); the
                           least recently used objects are evicted past it
    KBPC_TRACEBACK         1: an internal error prints its Python traceback
    KBPC_TEST_CUBIN_CACHE  folder for the GPU test harness's cubins (default: the temp folder)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from kbpc.errors import KbpcError

DEFAULT_CACHE_LIMIT = 5 << 30
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, where: str) -> int:
    """'5G', '500M', '123456' (bytes) -> bytes; a KbpcError naming `where` otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise KbpcError(f"expected a size such as 2G, 500M or a number of bytes, got {text[:40]!r}", where)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class Environment:
    cache_dir: Path | None
    cache_limit: int
    traceback: bool
    test_cubin_cache: Path | None


def _path(name: str) -> Path | None:
    value = os.environ.get(name, "")
    return Path(value).expanduser() if value else None


def environment() -> Environment:
    """The environment as kbpc reads it now (read on each call, so tests may change it)."""
    limit = os.environ.get("KBPC_CACHE_LIMIT", "")
    return Environment(
        cache_dir=_path("KBPC_CACHE_DIR"),
        cache_limit=parse_size(limit, "KBPC_CACHE_LIMIT") if limit else DEFAULT_CACHE_LIMIT,
        traceback=os.environ.get("KBPC_TRACEBACK", "") not in ("", "0"),
        test_cubin_cache=_path("KBPC_TEST_CUBIN_CACHE"),
    )
