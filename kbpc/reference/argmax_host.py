"""argmax_host: greedy token by one sequential scan of the BF16 logits on the host.

Math (explain.families.argmax_host): yhat = min{ i : z_i = max_j z_j }.

Numerics: each BF16 logit widened exactly to FP32 and compared with a strict greater-than against
the running maximum, so on exact ties the first (lowest) index wins; the result is an int32 index.

NaN choice: the scan starts from best = -inf at index 0 and takes z_i only when z_i > best, so a
NaN logit is never selected (every comparison with NaN is false) and an all-NaN or all -inf row
gives index 0. `argmax_scan` is that loop, literally; `argmax_host` is the same result computed
vectorised (NaN -> -inf, then numpy's first-index argmax).
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.formats import bf16_from_bits

F32 = np.float32


def _widen(logits) -> np.ndarray:
    z = np.asarray(logits)
    return bf16_from_bits(z) if z.dtype == np.uint16 else z.astype(F32)


def argmax_scan(logits) -> int:
    """The host loop over one row: strict greater-than against the running max, from -inf."""
    z = _widen(logits)
    best, idx = F32(-np.inf), 0
    for i, v in enumerate(z.tolist()):
        if v > best:
            best, idx = v, i
    return idx


def argmax_host(logits) -> np.ndarray:
    """First index of the max per row; logits (..., V) as BF16 bits (uint16) or BF16 values."""
    z = _widen(logits)
    z = np.where(np.isnan(z), F32(-np.inf), z)
    return np.argmax(z, axis=-1).astype(np.int32)
