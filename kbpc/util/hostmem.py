"""How much host memory this process may still allocate: the kernel's MemAvailable estimate,
lowered by an address-space limit (ulimit -v) when one is set. None when neither is known."""
from __future__ import annotations

import os
import resource


def _meminfo_bytes(field: str, path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name == field:
                    return int(rest.split()[0]) * 1024   # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _address_space_left() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _meminfo_bytes("VmSize", "/proc/self/status") or 0
    return max(0, soft - used)


def available_host_bytes() -> int | None:
    candidates = [_meminfo_bytes("MemAvailable"), _address_space_left()]
    if candidates[0] is None:
        try:
            candidates[0] = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            pass
    known = [c for c in candidates if c is not None]
    return min(known) if known else None
