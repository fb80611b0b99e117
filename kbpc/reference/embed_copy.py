"""embed_copy: embedding rows copied byte for byte (no kernel).

Math (explain.families.embed_copy): h_t = E_{tok_t, :}, t = 1..m, E in R^{V x d}.

Numerics: pure data movement; the BF16 row is copied bit for bit, no widening or rounding. The
table is taken as raw BF16 bits (uint16, (V, d)) so the copy is checkably byte exact; any dtype
works, the result has the table's dtype. Choice: a token id outside [0, V) is an error (the
engine's device-to-device copy would read out of bounds), raised as ValueError.
"""
from __future__ import annotations

import numpy as np


def embed_copy(table, tokens) -> np.ndarray:
    """Rows tokens[t] of table, (m,) -> (m, d), same dtype (and bytes) as the table."""
    table = np.asarray(table)
    tok = np.asarray(tokens)
    if tok.ndim != 1 or not np.issubdtype(tok.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array, got {tok.dtype} {tok.shape}")
    bad = (tok < 0) | (tok >= table.shape[0])
    if bad.any():
        raise ValueError(f"token id {int(tok[bad][0])} outside the table's {table.shape[0]} rows")
    return table[tok].copy()
