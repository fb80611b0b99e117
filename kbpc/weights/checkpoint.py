"""Safetensors checkpoints with ModelOpt-style NVFP4 names. Writing uses the safetensors library;
reading memory-maps each file and checks every tensor the blueprint needs (present, dtype, shape,
finite), so a checkpoint can be streamed to the GPU without a host copy of the whole model."""
from __future__ import annotations

import struct
from math import prod
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save

from kbpc.errors import WeightsError
from kbpc.ir.weights import WeightSpec
from kbpc.util.atomic import atomic_writer
from kbpc.util.jsonload import parse_json

# storage kind -> (safetensors dtype, numpy dtype to write with, numpy dtype we hold it as)
_ST = {
    "bf16": ("BF16", ml_dtypes.bfloat16, np.uint16),
    "f32": ("F32", np.float32, np.float32),
    "e4m3": ("F8_E4M3", ml_dtypes.float8_e4m3fn, np.uint8),
    "e2m1x2": ("U8", np.uint8, np.uint8),
    "i32": ("I32", np.int32, np.int32),
}
_HOLD = {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8, "U8": np.uint8, "I32": np.int32,
         "F16": np.float16, "I8": np.int8}


# what kbpc holds each storage kind, and each safetensors dtype, as (for readers elsewhere)
STORAGE_DTYPE = {storage: held for storage, (_, _, held) in _ST.items()}
HELD_DTYPE = _HOLD


def write_checkpoint(path: Path, weights: dict[str, np.ndarray], specs: list[WeightSpec]) -> None:
    """Write one .safetensors file atomically."""
    tensors = {}
    for spec in specs:
        st_name, write_dtype, _ = _ST[spec.storage]
        tensors[spec.name] = np.ascontiguousarray(weights[spec.name]).view(write_dtype).reshape(spec.shape)
    blob = save(tensors, metadata={"format": "kbpc", "producer": "kbpc"})
    with atomic_writer(Path(path)) as fh:
        fh.write(blob)


def read_header(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise WeightsError("not a safetensors file (too short)", str(path))
            (size,) = struct.unpack("<Q", raw)
            if size > 100 << 20:
                raise WeightsError("not a safetensors file (header size implausible)", str(path))
            data = fh.read(size)
    except FileNotFoundError:
        raise WeightsError("checkpoint file not found", str(path)) from None
    except OSError as exc:
        raise WeightsError(f"cannot read checkpoint: {exc.strerror or exc}", str(path)) from None
    header = parse_json(data, str(path), error=WeightsError, what="safetensors header")
    if not isinstance(header, dict):
        raise WeightsError("not a safetensors file (the header is not a JSON object)", str(path))
    return header, 8 + size


def open_checkpoint(source: Path) -> dict[str, np.ndarray]:
    """name -> memory-mapped array (held dtype) from a file or every *.safetensors in a folder."""
    source = Path(source)
    files = sorted(source.glob("*.safetensors")) if source.is_dir() else [source]
    if not files:
        raise WeightsError("no *.safetensors files in this folder", str(source))
    out: dict[str, np.ndarray] = {}
    for path in files:
        header, base = read_header(path)
        total = path.stat().st_size
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, start = _entry(name, info, base, total, str(path))
            count = prod(shape)
            arr = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=(count,)) if count else \
                np.zeros((0,), dtype)
            out[name] = arr.reshape(shape)
    return out


def _entry(name: str, info: object, base: int, total: int, where: str) -> tuple[type, list[int], int]:
    """(held dtype, shape, data start) of one header entry, every field checked against the file."""
    def bad(why: str) -> WeightsError:
        return WeightsError(f"tensor {name!r}: {why}", where)

    if not isinstance(info, dict):
        raise bad("its header entry is not an object")
    dtype = _HOLD.get(info.get("dtype")) if isinstance(info.get("dtype"), str) else None
    if dtype is None:
        raise bad(f"unsupported dtype {info.get('dtype')!r}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise bad("shape must be a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise bad("data_offsets must be [start, end] with 0 <= start <= end")
    start, end = offsets
    if base + end > total:
        raise bad("runs past the end of the file (truncated?)")
    if prod(shape) * np.dtype(dtype).itemsize != end - start:
        raise bad(f"shape {shape} does not fill its {end - start} data bytes")
    return dtype, shape, start


def load_checkpoint(source: Path, specs: list[WeightSpec]) -> dict[str, np.ndarray]:
    """The tensors `specs` name, checked for presence, dtype, shape and finiteness."""
    tensors = open_checkpoint(source)
    out = {}
    for spec in specs:
        where = f"{source}: {spec.name}"
        if spec.name not in tensors:
            raise WeightsError("tensor missing from the checkpoint", where)
        arr = tensors[spec.name]
        want = _ST[spec.storage][2]
        if arr.dtype != want:
            raise WeightsError(f"dtype {arr.dtype} but the blueprint needs {spec.storage}", where)
        if tuple(arr.shape) != tuple(spec.shape):
            raise WeightsError(f"shape {tuple(arr.shape)} but the blueprint needs {tuple(spec.shape)}", where)
        check_finite(spec, arr, where)
        out[spec.name] = arr
    return out


def check_finite(spec: WeightSpec, arr: np.ndarray, where: str) -> None:
    if spec.storage == "f32":
        bad = ~np.isfinite(arr)
    elif spec.storage == "bf16":
        bad = (arr & 0x7F80) == 0x7F80
    elif spec.storage == "e4m3":
        bad = (arr & 0x7F) == 0x7F
    else:
        return
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise WeightsError(f"{int(bad.sum())} non-finite values (first at index {first})", where)
