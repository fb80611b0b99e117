"""Safetensors checkpoints with ModelOpt-style NVFP4 names. Writing uses the safetensors library;
reading memory-maps each file and checks every tensor the blueprint needs (present, dtype, shape,
finite), so a checkpoint can be streamed to the GPU without a host copy of the whole model."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save

from kbpc.errors import WeightsError
from kbpc.ir.weights import WeightSpec
from kbpc.util.atomic import atomic_writer

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
            header = json.loads(fh.read(size))
    except FileNotFoundError:
        raise WeightsError("checkpoint file not found", str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise WeightsError("not a safetensors file (header is not JSON)", str(path)) from None
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
            dtype = _HOLD.get(info.get("dtype"))
            if dtype is None:
                raise WeightsError(f"tensor {name!r} has unsupported dtype {info.get('dtype')!r}", str(path))
            start, end = info["data_offsets"]
            if base + end > total:
                raise WeightsError(f"tensor {name!r} runs past the end of the file (truncated?)", str(path))
            count = int(np.prod(info["shape"], dtype=np.int64))
            arr = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=(count,))
            out[name] = arr.reshape(info["shape"])
    return out


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
