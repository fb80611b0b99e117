"""Host-side comparisons for GPU tests: BF16 ulp distances and FP32 closeness with a stated bound.

Pure numpy (no GPU): the GPU tests use these on fetched outputs, and they are unit-tested on CPU.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import bf16_bits


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Map IEEE bit patterns to integers whose order is the numeric order (+0 and -0 both 0)."""
    b = np.asarray(bits).astype(np.int64)
    sign = 1 << (width - 1)
    return np.where(b & sign, -(b & (sign - 1)), b)


def bf16_ulp_distance(gpu_bits, ref_values) -> np.ndarray:
    """How many BF16 steps apart the GPU's raw BF16 bits and rn_bf16(ref_values) are."""
    ref = bf16_bits(np.asarray(ref_values, np.float32))
    return np.abs(_ordered(np.asarray(gpu_bits, np.uint16), 16) - _ordered(ref, 16))


def assert_bf16_within(gpu_bits, ref_values, ulps: int, name: str = "output") -> None:
    """Every element within `ulps` BF16 steps of the reference (0: bit-exact)."""
    d = bf16_ulp_distance(gpu_bits, ref_values)
    if d.size and d.max() > ulps:
        idx = np.unravel_index(int(np.argmax(d)), d.shape)
        raise AssertionError(f"{name}: {int((d > ulps).sum())} of {d.size} elements more than {ulps} "
                             f"BF16 ulp off; worst at {idx}: {int(d[idx])} ulp")


def assert_f32_exact(gpu, ref, name: str = "output") -> None:
    """Bit-identical FP32 arrays (the sign of zero included)."""
    g = np.asarray(gpu, np.float32).view(np.uint32)
    r = np.asarray(ref, np.float32).view(np.uint32)
    bad = g != r
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} FP32 values differ; first at "
                             f"{idx}: {np.asarray(gpu).reshape(bad.shape)[idx]!r} vs "
                             f"{np.asarray(ref).reshape(bad.shape)[idx]!r}")


def assert_f32_close(gpu, ref, rtol: float, atol: float | np.ndarray = 0.0, name: str = "output") -> None:
    """|gpu - ref| <= atol + rtol * |ref| elementwise (atol may be an array), no NaN anywhere."""
    g = np.asarray(gpu, np.float64)
    r = np.asarray(ref, np.float64)
    if np.isnan(g).any() or np.isnan(r).any():
        raise AssertionError(f"{name}: NaN in {'GPU' if np.isnan(g).any() else 'reference'} output")
    err = np.abs(g - r)
    bound = np.asarray(atol, np.float64) + rtol * np.abs(r)
    bad = err > bound
    if bad.any():
        idx = np.unravel_index(int(np.argmax(err - bound)), err.shape)
        raise AssertionError(f"{name}: {int(bad.sum())} of {err.size} elements out of tolerance "
                             f"(rtol={rtol:g}); worst at {idx}: {g[idx]!r} vs {r[idx]!r}")


def logit_rms_over_std(logits, ref) -> tuple[np.ndarray, float]:
    """Per position (rows): RMS of (logits - ref) over the reference logits' standard deviation;
    and the same over all positions (RMS difference over RMS standard deviation)."""
    a, r = np.asarray(logits, np.float64), np.asarray(ref, np.float64)
    if a.shape != r.shape:
        raise AssertionError(f"logits {a.shape} vs reference {r.shape}")
    sq, var = ((a - r) ** 2).mean(axis=-1), r.var(axis=-1)
    return np.sqrt(sq / var), float(np.sqrt(sq.mean() / var.mean()))


def same_greedy(logits, ref) -> float:
    """Fraction of positions whose argmax (first index on ties) agrees."""
    return float((np.argmax(logits, axis=-1) == np.argmax(ref, axis=-1)).mean())
