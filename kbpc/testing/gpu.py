"""GPU harness: compile a CUDA translation unit with nvcc, load it with PyCUDA, launch kernels on
fresh inputs with poisoned outputs, and check that every output element was written.

PyCUDA is imported lazily: importing this module costs nothing on a machine without a GPU.

    mod = load_module('#include "w4a16_gemv.cuh"\\n template __global__ ...', "w4a16_test")
    out = poisoned((n,), np.uint16)            # BF16 bits, poisoned with NaN
    mod.get_function("kernel")(..., out.gpudata, block=(256, 1, 1), grid=(g, 1))
    y = fetch(out)                              # raises if any element kept its poison
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from kbpc.toolchain.assets import KERNELS_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, compile_cuda
from kbpc.targets import get_target

# Poison bytes: 0xFF makes every float (FP32, BF16 bits, E4M3 codes) a NaN, which no kernel of the
# blueprint produces from finite inputs; int32 outputs use 0xA5A5A5A5, which no id or index equals.
FLOAT_POISON_BYTE = 0xFF
INT_POISON_BYTE = 0xA5

_CACHE_DIR = Path(os.environ.get("KBPC_TEST_CUBIN_CACHE", tempfile.gettempdir())) / "kbpc-test-cubins"


def _cuda():
    import pycuda.autoprimaryctx  # noqa: F401, PLC0415  (retains the primary context)
    import pycuda.driver as cuda  # noqa: PLC0415

    return cuda


def headers_digest() -> str:
    """SHA-256 over the compile flags and every kernels/ header (a test binary's cache key part)."""
    digest = hashlib.sha256()
    for part in (*BASE_FLAGS, *(h.read_text() for h in sorted(KERNELS_DIR.glob("*.cuh")))):
        digest.update(part.encode())
    return digest.hexdigest()


def load_module(source: str, name: str, target: str = "sm_90", extra_flags: tuple[str, ...] = ()):
    """Compile `source` (which may #include any kernels/ header) and load it; cached by content."""
    cuda = _cuda()
    digest = hashlib.sha256()
    for part in (source, target, *extra_flags, headers_digest()):
        digest.update(part.encode())
    key = digest.hexdigest()[:20]
    cubin = _CACHE_DIR / f"{name}-{key}.cubin"
    if not cubin.exists():
        src = _CACHE_DIR / f"{name}-{key}.cu"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(source)
        compile_cuda(src, cubin, get_target(target), kind="cubin", extra_flags=extra_flags)
    return cuda.module_from_file(str(cubin))


def to_gpu(arr: np.ndarray):
    from pycuda import gpuarray  # noqa: PLC0415

    _cuda()
    return gpuarray.to_gpu(np.ascontiguousarray(arr))


def _poison_byte(dtype: np.dtype) -> int:
    return INT_POISON_BYTE if np.dtype(dtype).kind in "i" else FLOAT_POISON_BYTE


def poisoned(shape, dtype):
    """A device array filled with the poison pattern for its dtype."""
    from pycuda import gpuarray  # noqa: PLC0415

    cuda = _cuda()
    arr = gpuarray.empty(shape, dtype)
    if arr.nbytes:
        cuda.memset_d8(arr.gpudata, _poison_byte(arr.dtype), arr.nbytes)
    return arr


def fetch(arr, name: str = "output", allow_nan: bool = False) -> np.ndarray:
    """Copy a device array back and raise AssertionError if any element still holds its poison."""
    host = arr.get()
    pattern = np.full(host.dtype.itemsize, _poison_byte(host.dtype), np.uint8)
    raw = host.view(np.uint8).reshape(-1, host.dtype.itemsize) if host.size else np.zeros((0, 1), np.uint8)
    unwritten = np.all(raw == pattern, axis=1)
    if not allow_nan and unwritten.any():
        idx = np.flatnonzero(unwritten)
        raise AssertionError(f"{name}: {idx.size} of {host.size} elements were never written "
                             f"(first flat indices {idx[:8].tolist()})")
    return host


def synchronize() -> None:
    _cuda().Context.synchronize()
