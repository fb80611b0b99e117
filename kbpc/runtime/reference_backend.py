"""The CPU backend: the reference interpreter behind the StepBackend interface."""
from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np

from kbpc.errors import KbpcError, WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import Options
from kbpc.ir.state import state_buffers
from kbpc.ir.weights import WeightSpec, weight_specs
from kbpc.reference.interpreter import Interpreter
from kbpc.report.render import human_bytes
from kbpc.util.hostmem import available_host_bytes
from kbpc.weights.checkpoint import check_finite, load_checkpoint
from kbpc.weights.hf_checkpoint import is_hf_folder, load_hf_weights
from kbpc.weights.synthetic import parse_seed, synthetic_weights


def check_host_memory(bp: Blueprint, specs: list[WeightSpec], resident: bool, context: int) -> None:
    """Refuse, with the numbers, a model that does not fit in host memory: its weights when they
    are allocated (`resident`: synthetic; a checkpoint is memory-mapped), the largest weight
    decoded to FP32 inside a step, and the sequence state and caches for `context` tokens."""
    weights = sum(s.nbytes for s in specs) if resident else 0
    working = max((prod(s.shape) for s in specs), default=0) * 4
    state = sum(b.nbytes for b in state_buffers(bp, Options(max_context=context)))
    needed, available = weights + working + state, available_host_bytes()
    if available is not None and needed > available:
        raise KbpcError(
            f"the reference backend needs about {human_bytes(needed)} of host memory ({human_bytes(weights)} "
            f"of weights, {human_bytes(working)} to decode the largest one, {human_bytes(state)} of state "
            f"for {context:,} tokens) but {human_bytes(available)} is available; run a smaller blueprint "
            "(kbpc shrink --preset tiny), a shorter context, or the GPU backend", "--backend reference")


def load_weights(bp: Blueprint, source: str, context: int = 1) -> dict[str, np.ndarray]:
    """`synthetic:SEED`, a safetensors file/folder in kbpc's names, or a Hugging Face checkpoint
    folder (converted by its family's mapping table), checked against the blueprint's specs, once
    the host is known to hold them and `context` tokens of state."""
    specs = weight_specs(bp)
    check_host_memory(bp, specs, source.startswith("synthetic:"), context)
    if source.startswith("synthetic:"):
        weights = synthetic_weights(bp, parse_seed(source))
        for spec in specs:
            check_finite(spec, weights[spec.name], f"{source}: {spec.name}")
        return weights
    path = Path(source)
    if not path.exists():
        raise WeightsError("no such checkpoint file or folder (or use synthetic:SEED)", source)
    if is_hf_folder(path):
        return load_hf_weights(bp, path)
    return load_checkpoint(path, specs)


class ReferenceBackend:
    def __init__(self, bp: Blueprint, weights: dict[str, np.ndarray], max_context: int,
                 act_quant: bool = True, index_cache: str = "f32"):
        """act_quant=False: the debugging variant of kbpc/reference/no_act_quant.py. index_cache:
        the compile option a bundle records (f32 | fp8); the reference follows it."""
        from kbpc.reference import no_act_quant
        self.interpreter = Interpreter(bp, weights, max_context, None if act_quant else no_act_quant.HANDLERS,
                                       index_cache=index_cache)
        self.vocab = bp.symbols.get("vocab") or weights[next(iter(weights))].shape[0]

    def step(self, token: int):
        return self.interpreter.step(token)
