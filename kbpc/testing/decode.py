"""Greedy decoding of a bundle on the GPU with synthetic weights, for tests and scripts that compare
builds of one blueprint bit for bit (PDL or not, fusion rules, streams, prefetch)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

# A prompt of assorted ids (all below the smallest vocabulary kbpc builds); after it, the build's own
# greedy tokens.
PROMPT = (1, 5, 9, 200, 77, 3000, 12, 8, 431, 999, 17, 2048)


def decode_logits(path: Path, trust, positions: int, prompt: tuple[int, ...] = PROMPT) -> np.ndarray:
    """(positions, vocab) FP32 logits of `positions` steps of the bundle at `path` on GPU 0, weights
    "synthetic:0" (the same for every bundle of one blueprint)."""
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.cuda_backend import CudaBackend

    gpu = CudaBackend(load_bundle_model(path, trust), "synthetic:0", positions)
    rows, token = [], prompt[0]
    try:
        for pos in range(positions):
            logits, nxt = gpu.step(token)
            rows.append(np.array(logits, copy=True))
            token = prompt[pos + 1] if pos + 1 < len(prompt) else nxt
    finally:
        gpu.close()
    return np.stack(rows)


def differing_positions(a: np.ndarray, b: np.ndarray) -> list[int]:
    """Positions whose logits differ in any bit."""
    return [i for i in range(len(a)) if not np.array_equal(a[i].view(np.uint32), b[i].view(np.uint32))]
