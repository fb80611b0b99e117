"""The CPU backend: the reference interpreter behind the StepBackend interface."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import weight_specs
from kbpc.reference.interpreter import Interpreter
from kbpc.weights.checkpoint import check_finite, load_checkpoint
from kbpc.weights.synthetic import parse_seed, synthetic_weights


def load_weights(bp: Blueprint, source: str) -> dict[str, np.ndarray]:
    """`synthetic:SEED` or a safetensors file/folder, checked against the blueprint's specs."""
    specs = weight_specs(bp)
    if source.startswith("synthetic:"):
        weights = synthetic_weights(bp, parse_seed(source))
        for spec in specs:
            check_finite(spec, weights[spec.name], f"{source}: {spec.name}")
        return weights
    path = Path(source)
    if not path.exists():
        raise WeightsError("no such checkpoint file or folder (or use synthetic:SEED)", source)
    return load_checkpoint(path, specs)


class ReferenceBackend:
    """`index_cache` is the compile option a bundle records (f32 | fp8): the reference follows it."""

    def __init__(self, bp: Blueprint, weights: dict[str, np.ndarray], max_context: int, index_cache: str = "f32"):
        self.interpreter = Interpreter(bp, weights, max_context, index_cache=index_cache)
        self.vocab = bp.symbols.get("vocab") or weights[next(iter(weights))].shape[0]

    def step(self, token: int):
        return self.interpreter.step(token)
