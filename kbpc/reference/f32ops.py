"""FP32 transcendentals and GPU block-reduction orders shared by the reference families.

Transcendentals (`exp_f32`, `sigmoid_f32`, `silu_f32`, `rsqrt_f32`) return float32. `exp` and
`rsqrt` are evaluated in float64 and rounded once, i.e. the correctly rounded float32 value (up to a
double-rounding case too rare to matter), so the reference does not depend on which SIMD path
numpy's own float32 `exp` takes. CUDA's expf / __expf / rsqrtf are within a few ulp of these; each
GPU test states the resulting tolerance. Everything else is one correctly rounded float32 op at a
time (a --fmad=false build).

Block reductions (each a fixed order built from `fp32.seq_sum` / `fp32.tree_sum`):

- `strided_tree_sum(x, threads)`: `threads` threads, thread t sums elements t, t+threads, ...
  sequentially in FP32, then a shared-memory halving tree over the `threads` partials (offsets
  threads/2, ..., 1; = `tree_sum`). Short axes are zero-padded: adding +0.0 is exact.
- `warp_block_sum(partials)`: per-thread partials reduced by a 32-lane warp butterfly, then the
  per-warp sums (one per lane of warp 0, zeros beyond) by a second 32-lane butterfly.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.fp32 import seq_sum, tree_sum

F32 = np.float32
WARP = 32


def exp_f32(x) -> np.ndarray:
    """expf(x): correctly rounded float32 exponential."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp(np.asarray(x, F32).astype(np.float64)).astype(F32)


def sigmoid_f32(x) -> np.ndarray:
    """sigma(x) = 1 / (1 + expf(-x)), each op rounded to float32 (true division)."""
    x = np.asarray(x, F32)
    return (F32(1) / (F32(1) + exp_f32(-x))).astype(F32)


def silu_f32(x) -> np.ndarray:
    """silu(x) = x / (1 + expf(-x)): one true division (the glm_swiglu_clamp form)."""
    x = np.asarray(x, F32)
    return (x / (F32(1) + exp_f32(-x))).astype(F32)


def rsqrt_f32(x) -> np.ndarray:
    """rsqrtf(x): correctly rounded float32 1/sqrt(x) (0 -> inf, negative -> NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1.0 / np.sqrt(np.asarray(x, F32).astype(np.float64))).astype(F32)


def _pad_axis(x: np.ndarray, length: int) -> np.ndarray:
    """Zero-pad the last axis of x up to `length`."""
    extra = length - x.shape[-1]
    if extra <= 0:
        return x
    return np.concatenate([x, np.zeros(x.shape[:-1] + (extra,), F32)], axis=-1)


def strided_tree_sum(x, axis: int = -1, threads: int = 256) -> np.ndarray:
    """Thread-strided FP32 partial sums, then a halving tree over `threads` (a power of two)."""
    x = np.moveaxis(np.asarray(x, F32), axis, -1)
    n = x.shape[-1]
    per_thread = max(1, -(-n // threads))
    x = _pad_axis(x, per_thread * threads)
    # element t + j*threads is row j, column t: thread t sums down its column.
    partials = seq_sum(x.reshape(x.shape[:-1] + (per_thread, threads)), axis=-2)
    return tree_sum(partials, axis=-1)


def warp_block_sum(partials, axis: int = -1) -> np.ndarray:
    """Sum of per-thread partials: warp butterfly, then a butterfly over the per-warp sums.

    The thread count along `axis` must be a multiple of 32 and at most 1024 (32 warps). A xor
    butterfly leaves every lane with the value lane 0 gets from the shuffle-down tree, which
    is `tree_sum` (float addition is commutative, so all lanes agree)."""
    p = np.moveaxis(np.asarray(partials, F32), axis, -1)
    n = p.shape[-1]
    if n % WARP or n > WARP * WARP:
        raise ValueError(f"thread count {n} is not a multiple of 32 in [32, 1024]")
    warp_sums = tree_sum(p.reshape(p.shape[:-1] + (n // WARP, WARP)), axis=-1)
    return tree_sum(_pad_axis(warp_sums, WARP), axis=-1)


def sum_pow2_tree(x, axis: int = -1) -> np.ndarray:
    """`tree_sum` over an axis of any length, zero-padded to the next power of two."""
    x = np.moveaxis(np.asarray(x, F32), axis, -1)
    n = max(1, x.shape[-1])
    return tree_sum(_pad_axis(x, 1 << (n - 1).bit_length()), axis=-1)
