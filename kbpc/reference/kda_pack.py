"""kda_pack: the KDA q|k|v pack of three projections (a pure copy).

Math (explain.families.kda_pack): p_t = [q_t  k_t  v_t], p_{t,j} = q_{t,j}, p_{t,n+j} = k_{t,j},
p_{t,2n+j} = v_{t,j}.

Numerics: BF16 in and out, bit for bit. Rows may be raw BF16 bits (uint16) or BF16 values; the
result keeps the dtype, so bits stay bits. The widths are taken from the inputs (v may be wider or
narrower than q and k when the value heads differ); the math's equal n is the common case.
"""
from __future__ import annotations

import numpy as np


def kda_pack(q, k, v) -> np.ndarray:
    """[q | k | v] along the last axis, (..., nq), (..., nk), (..., nv) -> (..., nq+nk+nv)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.shape[:-1] == k.shape[:-1] == v.shape[:-1]):
        raise ValueError(f"q, k, v rows differ: {q.shape}, {k.shape}, {v.shape}")
    return np.concatenate([q, k, v], axis=-1)
