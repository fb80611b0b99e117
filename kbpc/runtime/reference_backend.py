"""The CPU backend: the reference interpreter behind the StepBackend interface."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kbpc.errors import WeightsError
from kbpc.ir.graph import Blueprint
from kbpc.ir.weights import weight_specs
from kbpc.reference.interpreter import Interpreter
from kbpc.weights.checkpoint import check_finite, load_checkpoint
from kbpc.weights.hf_checkpoint import is_hf_folder, load_hf_weights
from kbpc.weights.synthetic import parse_seed, synthetic_weights


def load_weights(bp: Blueprint, source: str) -> dict[str, np.ndarray]:
    """`synthetic:SEED`, a safetensors file/folder in kbpc's names, or a Hugging Face checkpoint
    folder (converted by its family's mapping table), checked against the blueprint's specs."""
    specs = weight_specs(bp)
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
