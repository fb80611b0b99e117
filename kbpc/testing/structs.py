"""Bytes of a by-value kernel parameter struct, for kbpc.testing.launchers (which checks the total
against sizeof). Fields are given in declaration order as (kind, value): "ptr" a device pointer (a
PyCUDA GPUArray or DeviceAllocation, an int address, or None for nullptr), "f32" a float, "i32" an
int. Each field sits at its natural alignment (8, 4, 4) and the struct is padded to its largest
alignment, as the C++ ABI lays out a struct of those members."""
from __future__ import annotations

import struct
from typing import Any, Sequence

_KINDS = {"ptr": ("<Q", 8), "f32": ("<f", 4), "i32": ("<i", 4)}


def _address(value: Any) -> int:
    if value is None:
        return 0
    return int(getattr(value, "gpudata", value))


def pack_struct(fields: Sequence[tuple[str, Any]]) -> bytes:
    out = bytearray()
    widest = 1
    for kind, value in fields:
        if kind not in _KINDS:
            raise ValueError(f"unknown field kind {kind!r} (one of {sorted(_KINDS)})")
        fmt, size = _KINDS[kind]
        widest = max(widest, size)
        out += bytes(-len(out) % size)
        out += struct.pack(fmt, _address(value) if kind == "ptr" else value)
    out += bytes(-len(out) % widest)
    return bytes(out)
