"""Checkpoints bound to a bundle: a bundle names the checkpoint files it was compiled for by name,
size and SHA-256 (manifest `checkpoint`). Loading streams each file once, front to back: every
byte goes through the file's hash, and the bytes of the tensors the blueprint needs are handed to a
sink (a GPU copy, or host arrays) as they pass, so a 100 GB checkpoint is read once, not once to
check and once to load. A file whose hash differs is refused when its last byte has been read,
before any step runs.

Also the compile-time check that a checkpoint holds every tensor the blueprint needs, from the
files' headers only (no data read), so a wrong `--weights` is refused before nvcc runs."""
from __future__ import annotations

import bisect
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from kbpc.errors import VerificationError, WeightsError
from kbpc.ir.weights import WeightSpec
from kbpc.weights.checkpoint import HELD_DTYPE, STORAGE_DTYPE, read_header

_MAX_HEADER = 100 << 20
_CHUNK = 16 << 20

Sink = Callable[[WeightSpec, int, memoryview], None]   # (tensor, byte offset in it, bytes)


@dataclass(frozen=True)
class CheckpointFile:
    """One file as a bundle's manifest binds it."""
    name: str
    bytes: int
    sha256: str


class ChecksumMismatch(VerificationError):
    """A checkpoint file is not the one the bundle was compiled for."""


def checkpoint_files(source: Path) -> list[Path]:
    """The safetensors files of a checkpoint (one file, or every *.safetensors in a folder)."""
    source = Path(source)
    files = sorted(source.glob("*.safetensors")) if source.is_dir() else [source]
    if not files or not all(f.is_file() for f in files):
        raise WeightsError("no safetensors checkpoint here", str(source))
    return files


def _header(raw: bytes, where: str) -> tuple[dict | None, int]:
    """(header, where the data starts); header None while `raw` does not hold all of it yet."""
    if len(raw) < 8:
        raise WeightsError("not a safetensors file (too short)", where)
    (size,) = struct.unpack("<Q", raw[:8])
    if size > _MAX_HEADER:
        raise WeightsError("not a safetensors file (header size implausible)", where)
    if len(raw) < 8 + size:
        return None, 8 + size
    try:
        header = json.loads(raw[8:8 + size])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WeightsError("not a safetensors file (header is not JSON)", where) from None
    if not isinstance(header, dict):
        raise WeightsError("not a safetensors file (header is not an object)", where)
    return header, 8 + size


def _entry(header: dict, spec: WeightSpec, where: str) -> tuple[int, int] | None:
    """(start, end) of `spec` in the file's data section, checked against the spec; None if absent."""
    info = header.get(spec.name)
    if info is None:
        return None
    where = f"{where}: {spec.name}"
    if not isinstance(info, dict) or not isinstance(info.get("data_offsets"), list):
        raise WeightsError("malformed tensor entry", where)
    if HELD_DTYPE.get(info.get("dtype")) != STORAGE_DTYPE[spec.storage]:
        raise WeightsError(f"dtype {info.get('dtype')} but the blueprint needs {spec.storage}", where)
    if tuple(info.get("shape", ())) != tuple(spec.shape):
        raise WeightsError(f"shape {tuple(info.get('shape', ()))} but the blueprint needs {tuple(spec.shape)}",
                           where)
    start, end = info["data_offsets"]
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end and end - start == spec.nbytes):
        raise WeightsError(f"data offsets {start}..{end} do not hold {spec.nbytes} bytes", where)
    return start, end


def check_covers(source: Path, specs: list[WeightSpec]) -> None:
    """Refuse a checkpoint that lacks a tensor the blueprint needs, or holds it with another dtype
    or shape. Reads only the files' headers."""
    needed = {s.name: s for s in specs}
    for path in checkpoint_files(source):
        header, _ = read_header(path)
        if not isinstance(header, dict):
            raise WeightsError("not a safetensors file (header is not an object)", str(path))
        for name in [n for n in needed if n in header]:
            _entry(header, needed.pop(name), str(path))
    if needed:
        missing = sorted(needed)
        kind = "none" if len(missing) == len(specs) else f"only {len(specs) - len(missing)} of {len(specs)}"
        raise WeightsError(f"the checkpoint holds {kind} of the blueprint's weight tensors (missing: "
                           f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''})", str(source))


def file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk


def stream_file(name: str, chunks: Iterable[bytes], specs: list[WeightSpec], sink: Sink) -> tuple[str, int, set[str]]:
    """Read one safetensors file from `chunks` once: hand each needed tensor's bytes to `sink` as
    they pass; return (SHA-256 of the whole file, its size, the tensors it held)."""
    digest, pos, head = hashlib.sha256(), 0, b""
    ranges: list[tuple[int, int, WeightSpec]] = []   # absolute (start, end), sorted
    starts: list[int] = []
    base = None
    for chunk in chunks:
        digest.update(chunk)
        view = memoryview(chunk)
        if base is None:
            head += chunk
            header, base_at = _header(head, name) if len(head) >= 8 else (None, 0)
            if header is not None:
                base = base_at
                found = [(e, s) for s in specs if (e := _entry(header, s, name)) is not None]
                ranges = sorted((base + a, base + b, s) for (a, b), s in found)
                starts = [r[0] for r in ranges]
        if base is not None:
            _feed(ranges, starts, pos, view, sink)
        pos += len(chunk)
    if base is None:
        _header(head, name)   # too short, or an implausible header size
        raise WeightsError("not a safetensors file (ends inside its header)", name)
    if ranges and ranges[-1][1] > pos:
        raise WeightsError("a tensor runs past the end of the file (truncated?)", name)
    return digest.hexdigest(), pos, {s.name for _, _, s in ranges}


def _feed(ranges, starts, pos: int, view: memoryview, sink: Sink) -> None:
    """Hand the parts of the tensors that overlap bytes [pos, pos + len(view)) to `sink`."""
    end = pos + len(view)
    i = max(0, bisect.bisect_right(starts, pos) - 1)
    while i < len(ranges) and ranges[i][0] < end:
        start, stop, spec = ranges[i]
        lo, hi = max(start, pos), min(stop, end)
        if lo < hi:
            sink(spec, lo - start, view[lo - pos:hi - pos])
        i += 1


def stream_bound(files: list[tuple[CheckpointFile | None, str, Iterable[bytes]]], specs: list[WeightSpec],
                 sink: Sink) -> None:
    """Stream every file (each with the record the bundle binds it to, or None for an unbound
    checkpoint) and check that together they held every needed tensor and matched their records."""
    held: set[str] = set()
    for record, name, chunks in files:
        sha, size, got = stream_file(name, chunks, [s for s in specs if s.name not in held], sink)
        held |= got
        if record is not None and (sha != record.sha256 or size != record.bytes):
            raise ChecksumMismatch(f"this is not the checkpoint file the bundle was compiled for: {size} bytes, "
                                   f"SHA-256 {sha[:16]}…; the bundle binds {record.bytes} bytes, SHA-256 "
                                   f"{record.sha256[:16]}…", name)
    missing = [s.name for s in specs if s.name not in held]
    if missing:
        raise WeightsError(f"{len(missing)} of the blueprint's weight tensors are not in the checkpoint "
                           f"(first: {missing[0]})", files[0][1] if files else "--weights")
