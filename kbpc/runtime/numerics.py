"""End-to-end numerics check of a bundle: the GPU step against the reference interpreter with the
same synthetic weights and the same token sequence (teacher forcing: both sides are fed the
reference's greedy tokens, so one early disagreement cannot derail the rest)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kbpc.errors import KbpcError
from kbpc.ir.ops import selection_is_a_set, unranked_scores_reader
from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.reference_backend import ReferenceBackend, load_weights

# The end-to-end contract per numerics mode (DESIGN): `exact` is bit for bit, `fast` within a
# teacher-forced relative L2 of the logits and a share of identical greedy tokens. A build without
# activation quantization (a debugging aid) is held to the fast criterion against the unquantized
# reference in either mode: its dequantizing GEMVs and FP32 softmax sum in their own order.
LIMITS = {"exact": (0.0, 1.0), "fast": (1e-2, 0.95), "no-act-quant": (1e-2, 0.95)}


def check_mode(model: BundleModel) -> str:
    """The criterion a bundle is held to: its numerics mode, or no-act-quant."""
    mode = model.run.numerics if model.act_quant else "no-act-quant"
    if mode not in LIMITS:
        raise KbpcError(f"the manifest names numerics mode {mode!r}; known: {', '.join(LIMITS)}")
    return mode


@dataclass
class NumericsReport:
    positions: int
    mode: str = "exact"
    rel_l2: list[float] = field(default_factory=list)
    same_token: list[bool] = field(default_factory=list)

    @property
    def limits(self) -> tuple[float, float]:
        return LIMITS[self.mode]

    @property
    def max_rel_l2(self) -> float:
        return max(self.rel_l2, default=0.0)

    @property
    def agreement(self) -> float:
        return sum(self.same_token) / max(1, len(self.same_token))

    @property
    def passed(self) -> bool:
        rel_l2, agreement = self.limits
        return self.max_rel_l2 <= rel_l2 and self.agreement >= agreement

    def to_json(self) -> dict:
        rel_l2, agreement = self.limits
        return {"positions": self.positions, "mode": self.mode, "max_rel_l2": self.max_rel_l2,
                "agreement": self.agreement, "rel_l2": self.rel_l2, "same_token": self.same_token,
                "passed": self.passed, "limits": {"rel_l2": rel_l2, "agreement": agreement}}


def compare_numerics(model: BundleModel, positions: int = 64, weights: str = "synthetic:0",
                     first_token: int = 1, on_position=None) -> NumericsReport:
    from kbpc.runtime.cuda_backend import CudaBackend

    if model.manifest.get("tp"):   # a split bundle: its ranks on this host's GPUs
        from kbpc.runtime.tp_run import verify_split
        report = verify_split(model, positions, weights, first_token)
        for pos in range(positions):
            if on_position:
                on_position(pos, report)
        return report
    bp = model.blueprint
    mode = check_mode(model)
    ref = ReferenceBackend(bp, load_weights(bp, weights, positions), positions, model.act_quant,
                           index_cache=model.index_cache)
    gpu = CudaBackend(model, weights, positions)
    report = NumericsReport(positions, mode)
    token = first_token
    try:
        for pos in range(positions):
            ref_logits, ref_next = ref.step(token)
            gpu_logits, gpu_next = gpu.step(token)
            diff = np.linalg.norm((gpu_logits - ref_logits).astype(np.float64))
            norm = np.linalg.norm(ref_logits.astype(np.float64)) or 1.0
            report.rel_l2.append(float(diff / norm))
            report.same_token.append(gpu_next == ref_next)
            if on_position:
                on_position(pos, report)
            token = ref_next
    finally:
        gpu.close()
    return report


@dataclass
class BufferDiff:
    position: int          # schedule position of the producer
    name: str
    format: str
    rel_l2: float          # for quantized buffers: fraction of code bytes that differ
    detail: str


def _reference_value(interp, name: str):
    node_id, edge = name.rsplit(".", 1)
    order = interp.bp.node_by_id[node_id].order
    return interp.last_values.get((order, edge))


def _as_array(value) -> np.ndarray:
    return np.asarray(getattr(value, "clamped", value), np.float32)


def set_valued(bp, name: str, numerics: str) -> bool:
    """Whether buffer `name` holds a selection the bundle's kernels may list in an order of their own
    (kbpc.ir.ops.selection_is_a_set of the node that writes it)."""
    node = bp.node_by_id.get(name.rsplit(".", 1)[0])
    return node is not None and selection_is_a_set(bp, node, numerics)


def left_unwritten(bp, name: str, numerics: str, seq_len: int) -> bool:
    """Whether the bundle's kernels leave buffer `name` unwritten at the step that caches seq_len
    tokens: the output of a projection that only feeds an unranked select's scores
    (kbpc.ir.ops.unranked_scores_reader) while that select lists every pool without scoring."""
    from kbpc.reference.dsa_indexer import IndexerGeometry, every_pool_selected
    node = bp.node_by_id.get(name.rsplit(".", 1)[0])
    if node is None or unranked_scores_reader(bp, node, numerics) is None:
        return False
    return every_pool_selected(IndexerGeometry.from_symbols(bp.symbols), seq_len, seq_len - 1)


def compare_intermediates(model: BundleModel, weights: str = "synthetic:0", steps: int = 2,
                          token: int = 1) -> list[BufferDiff]:
    """Run `steps` positions on both backends and compare every arena buffer after the last one.
    Needs a bundle compiled with --debug-arena (no buffer shares bytes with another)."""
    from kbpc.reference.formats import bf16_from_bits
    from kbpc.runtime.cuda_backend import CudaBackend

    plan = model.bundle.read_json("plan.json")
    if plan["options"].get("arena_reuse", True):
        raise KbpcError("comparing intermediates needs a bundle compiled with --debug-arena")
    bp = model.blueprint
    if not model.act_quant:
        raise KbpcError("comparing intermediates needs a bundle with activation quantization (its buffers "
                        "hold what the reference's do); this one was compiled with --no-act-quant")
    ref = ReferenceBackend(bp, load_weights(bp, weights, steps), steps, index_cache=model.index_cache)
    ref.interpreter.keep_values = True
    gpu = CudaBackend(model, weights, steps)
    try:
        for _ in range(steps):
            _, nxt = ref.step(token)
            gpu.step(token)
            token = nxt
        arena = np.empty(gpu.info.arena_bytes, np.uint8)
        gpu.cuda.memcpy_dtoh(arena, gpu.arena)
    finally:
        gpu.close()
    diffs = []
    for b in sorted(plan["buffers"], key=lambda b: b["first_use"]):
        raw = arena[b["offset"]:b["offset"] + b["nbytes"]]
        want = _reference_value(ref.interpreter, b["name"])
        if want is None or left_unwritten(bp, b["name"], model.run.numerics, steps):
            continue
        fmt = b["format"]
        if fmt in ("bf16", "f32", "i32"):
            got = {"bf16": lambda r: bf16_from_bits(r.view(np.uint16)), "f32": lambda r: r.view(np.float32),
                   "i32": lambda r: r.view(np.int32).astype(np.float32)}[fmt](raw)
            ref_arr = _as_array(want).reshape(-1)[: got.size]
            got = got[: ref_arr.size]
            if set_valued(bp, b["name"], model.run.numerics):   # the same entries in the form's own order
                got, ref_arr = np.sort(got), np.sort(ref_arr)
            err = float(np.linalg.norm((got - ref_arr).astype(np.float64)))
            scale = float(np.linalg.norm(ref_arr.astype(np.float64))) or 1.0
            detail = f"max |diff| {np.max(np.abs(got - ref_arr)) if got.size else 0:.3g}, |ref| {scale:.3g}"
            diffs.append(BufferDiff(b["first_use"], b["name"], fmt, err / scale, detail))
        else:   # quantized: the codes come first in the planar layout
            codes = np.asarray(want[0], np.uint8).reshape(-1)
            got = raw[: codes.size]
            frac = float(np.mean(got != codes)) if codes.size else 0.0
            diffs.append(BufferDiff(b["first_use"], b["name"], fmt, frac, f"{int(np.sum(got != codes))} codes differ"))
    return diffs
