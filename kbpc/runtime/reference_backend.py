"""The CPU backend: the reference interpreter behind the StepBackend interface."""
from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np

from kbpc.errors import KbpcError, WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import WeightSpec, weight_specs
from kbpc.report.render import human_bytes
from kbpc.util.hostmem import available_host_bytes
from kbpc.reference.interpreter import Interpreter
from kbpc.weights.checkpoint import check_finite, load_checkpoint
from kbpc.weights.synthetic import parse_seed, synthetic_weights


def check_host_memory(specs: list[WeightSpec], resident: bool) -> None:
    """Refuse, with the numbers, a model whose weights do not fit in host memory. `resident`:
    the weights are allocated (synthetic); otherwise they are memory-mapped and only the largest
    one, decoded to FP32 inside a step, must fit."""
    if not specs:
        return
    weights = sum(s.nbytes for s in specs) if resident else 0
    working = max(prod(s.shape) for s in specs) * 4
    available = available_host_bytes()
    if available is not None and weights + working > available:
        raise KbpcError(
            f"the reference backend needs about {human_bytes(weights + working)} of host memory "
            f"({human_bytes(weights)} of weights, {human_bytes(working)} to decode the largest one) but "
            f"{human_bytes(available)} is available; run a smaller blueprint (kbpc shrink --preset "
            "tiny) or use the GPU backend", "--backend reference")


def load_weights(bp: Blueprint, source: str) -> dict[str, np.ndarray]:
    """`synthetic:SEED` or a safetensors file/folder, checked against the blueprint's specs."""
    specs = weight_specs(bp)
    check_host_memory(specs, resident=source.startswith("synthetic:"))
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
    def __init__(self, bp: Blueprint, weights: dict[str, np.ndarray], max_context: int):
        self.interpreter = Interpreter(bp, weights, max_context)
        self.vocab = bp.symbols.get("vocab") or weights[next(iter(weights))].shape[0]

    def step(self, token: int):
        return self.interpreter.step(token)
