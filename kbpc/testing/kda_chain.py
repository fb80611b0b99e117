"""Test and benchmark support for the KDA decode chain (kernels/kda_fused.cuh and the five unfused
kernels): random layer data in the blueprint's weight names, the fused kernel's arguments, a
layer's chain lowered with and without the fusion pass, and a binder from a product Launch's
typed arguments to test arrays (so GPU tests run the product's own launches).

Everything here is host-side numpy until `bind` or `fused_args` meets device arrays (PyCUDA
GPUArrays, passed through untouched)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kbpc.codegen.args import ArenaPtr, FloatLit, IntLit, NullPtr, StatePtr, WeightPtr
from kbpc.codegen.families.kda_fused import KdaDims
from kbpc.codegen.records import Launch
from kbpc.ir.plan import Plan
from kbpc.reference.formats import bf16_bits, bf16_from_bits, e4m3_encode, quantize_fp8, to_bf16
from kbpc.reference.kda_fused import KdaLayerWeights
from kbpc.reference.kda_recurrent import query_scale

F32 = np.float32
CHAIN_FAMILIES = ("kda_pack", "causal_conv1d_l2norm", "kda_gates_w8a8", "kda_recurrent", "kda_o_norm")
FUSED_FAMILIES = ("kda_fused", "kda_conv_gates", "kda_recurrent")   # what fusion makes of the chain
INPUTS = ("q", "k", "v", "f_a", "g_a", "b")          # the fused kernel's row inputs, in order
INTERMEDIATES = ("packed", "conv", "f", "decay", "beta", "og", "core")


def widths(dims: KdaDims) -> dict[str, int]:
    """Elements of each row input, intermediate and the output (one token)."""
    n, c = dims.hv * dims.dk, dims.channels
    return {"q": dims.hk * dims.dk, "k": dims.hk * dims.dk, "v": dims.hv * dims.dv, "f_a": dims.kf,
            "g_a": dims.kg, "b": dims.hv, "packed": c, "conv": c, "f": n, "decay": n, "beta": dims.hv,
            "og": dims.hv * dims.dv, "core": dims.hv * dims.dv, "y": dims.hv * dims.dv}


def _bf16(rng, shape, std=1.0) -> np.ndarray:
    return to_bf16((rng.standard_normal(shape) * std).astype(F32))


def integer_rows(rng, k: int) -> np.ndarray:
    """A row whose E4M3 quantization is exact small integers times 2^-3 (s_a = 2^-3: one element is
    +-56), so every order of the gate GEMV's sums is exact."""
    x = rng.integers(-4, 5, k).astype(F32) * F32(0.125)
    x[rng.integers(0, k)] = F32(56.0) * rng.choice([-1.0, 1.0])
    return x


@dataclass(frozen=True)
class KdaLayerData:
    """One layer's parameters (BF16 and E4M3 as raw bits/codes) and a starting window and state.
    integer_gates: E4M3 gate weights are small integers, and `step_inputs` gives integer rows, so
    the tensor core's sums are exact in any order (the chain is then bit-exact to the reference)."""
    dims: KdaDims
    taps: np.ndarray
    bias: np.ndarray
    wf: tuple[np.ndarray, np.ndarray]
    wg: tuple[np.ndarray, np.ndarray]
    a_log: np.ndarray
    dt_bias: np.ndarray
    gamma: np.ndarray
    window: np.ndarray
    state: np.ndarray
    integer_gates: bool

    @classmethod
    def random(cls, rng, dims: KdaDims, integer_gates: bool) -> KdaLayerData:
        n, c = dims.hv * dims.dk, dims.channels

        def gate_weight(rows, k):
            if integer_gates:
                return e4m3_encode(rng.integers(-4, 5, (rows, k)).astype(F32)), rng.uniform(0.001, 0.01, rows).astype(F32)
            return quantize_fp8((rng.standard_normal((rows, k)) * 0.05).astype(F32))
        return cls(dims, bf16_bits(_bf16(rng, (c, dims.width), 0.5)), bf16_bits(_bf16(rng, c, 0.1)),
                   gate_weight(n, dims.kf), gate_weight(dims.hv * dims.dv, dims.kg),
                   rng.uniform(-1.0, 1.0, dims.hv).astype(F32), rng.uniform(-1.0, 1.0, n).astype(F32),
                   bf16_bits(to_bf16((1.0 + 0.2 * rng.standard_normal(dims.dv)).astype(F32))),
                   _bf16(rng, (c, dims.width)).astype(F32), (0.1 * rng.standard_normal(
                       (dims.hv, dims.dk, dims.dv))).astype(F32), integer_gates)

    def step_inputs(self, rng) -> dict[str, np.ndarray]:
        """One token's projection rows as BF16 bits."""
        w = widths(self.dims)
        rows = {name: _bf16(rng, w[name]) for name in ("q", "k", "v", "b")}
        for name in ("f_a", "g_a"):
            rows[name] = integer_rows(rng, w[name]) if self.integer_gates else _bf16(rng, w[name], 2.0)
        return {name: bf16_bits(rows[name]) for name in INPUTS}

    def reference_weights(self, l2_eps: float, lower_bound: float, norm_eps: float) -> KdaLayerWeights:
        return KdaLayerWeights(bf16_from_bits(self.taps), bf16_from_bits(self.bias), *self.wf, *self.wg,
                               self.a_log, self.dt_bias, bf16_from_bits(self.gamma), self.dims.dk,
                               l2_eps, lower_bound, norm_eps)

    def named_weights(self, block: str) -> dict[str, np.ndarray]:
        """The parameters under kbpc's weight names of KDA block `block` (e.g. "l0.kda")."""
        return {f"{block}.short_conv.conv_weight": self.taps, f"{block}.short_conv.conv_bias": self.bias,
                f"{block}.f_b.weight": self.wf[0], f"{block}.f_b.weight_scale": self.wf[1],
                f"{block}.g_b.weight": self.wg[0], f"{block}.g_b.weight_scale": self.wg[1],
                f"{block}.gates.A_log": self.a_log, f"{block}.gates.dt_bias": self.dt_bias,
                f"{block}.out_norm.weight": self.gamma}


def upload(data: KdaLayerData, inputs: dict[str, np.ndarray], to_gpu) -> dict:
    """Device arrays of a layer's parameters, window, state and one token's inputs, by the names
    fused_args reads. to_gpu: host array -> device array (kbpc.testing.gpu.to_gpu)."""
    host = {"taps": data.taps, "bias": data.bias, "wf": data.wf[0], "swf": data.wf[1], "wg": data.wg[0],
            "swg": data.wg[1], "a_log": data.a_log, "dt_bias": data.dt_bias, "gamma": data.gamma,
            "window": data.window, "state": data.state, **inputs}
    return {name: to_gpu(value) for name, value in host.items()}


def fused_args(dims: KdaDims, dev: dict, eps: tuple[float, float, float], out: dict) -> tuple:
    """The fused kernel's arguments in parameter order. dev: device arrays by name (INPUTS, "taps",
    "bias", "wf", "swf", "wg", "swg", "a_log", "dt_bias", "gamma", "window", "state"); eps:
    (l2 eps, gate lower bound, norm eps); out: "y" and any of INTERMEDIATES (missing: null)."""
    l2_eps, lower_bound, norm_eps = eps
    scale = float(query_scale(dims.dk))
    return (*(dev[n] for n in ("q", "k", "v", "f_a", "g_a", "b")), dev["taps"], dev["bias"], l2_eps,
            dev["wf"], dev["swf"], dev["wg"], dev["swg"], dev["a_log"], dev["dt_bias"], lower_bound, scale,
            dev["gamma"], 0, norm_eps, dev["window"], dev["state"], out["y"],
            *(out.get(n) for n in INTERMEDIATES))


@dataclass(frozen=True)
class ProductChain:
    """The product's launches for one KDA layer of a plan: the five unfused kernels (`plan`) and the
    fused kernels of the merged groups (`merged`, keeping the inner buffers so the fused kernels
    write them too), in step order. Buffer names: `inputs` (by INPUTS name), `inner`, and the
    output `gated`."""
    block: str
    plan: Plan
    unfused: tuple[Launch, ...]
    merged: Plan
    fused: tuple[Launch, ...]
    inputs: dict[str, str]
    inner: tuple[str, ...]
    gated: str

    @property
    def dims(self) -> KdaDims:
        sym, width = self.plan.blueprint.symbols, {b.name: b.elements for b in self.plan.buffers}
        return KdaDims(sym["lin_k_heads"], sym["lin_v_heads"], sym["lin_k_dim"], sym["lin_v_dim"],
                       width[self.inputs["f_a"]], width[self.inputs["g_a"]],
                       self.plan.blueprint.config.constants.conv_width)

    @property
    def state_names(self) -> tuple[str, str]:
        """(conv window, recurrent state) buffer names."""
        return f"{self.block}.short_conv.window", f"{self.block}.recur.state"


def product_chain(path: str, form: str = "kda_chain") -> ProductChain:
    """The first KDA layer of blueprint `path`, planned without and with the fusion pass and lowered
    both ways. The fused plan keeps the chain's inner buffers (their names; the unfused plan's arena
    offsets), so the fused kernels write every intermediate for comparison. form: "kda_chain" (the
    opt-in rules: one kda_fused launch) or "default" (the default rules: kda_conv_gates and
    kda_recurrence_norm, two launches)."""
    from kbpc.codegen.context import LowerCtx  # noqa: PLC0415
    from kbpc.codegen.families import lower_group  # noqa: PLC0415
    from kbpc.testing.lowering import planned  # noqa: PLC0415

    # every buffer its own bytes: the unfused chain keeps its pack copy (no concat written in place)
    plan = planned(path, arena_reuse=False)[0]
    if form == "kda_chain":
        fused_plan = planned(path, fuse=True, arena_reuse=False)[0]
    elif form == "default":
        fused_plan = planned(path, fuse=True, arena_reuse=False, opt_in=False)[0]
    else:
        raise ValueError(f"no KDA chain form {form!r}")
    bp = plan.blueprint
    first = min((g for g in plan.groups if g.family == "kda_recurrent"), key=lambda g: g.id)
    block = bp.node_by_id[first.nodes[0]].block
    chain = [g for g in plan.groups if g.family in CHAIN_FAMILIES and bp.node_by_id[g.nodes[0]].block == block]
    ctx = LowerCtx(plan)
    unfused = tuple(launch for g in chain for launch in lower_group(ctx, g))
    gated = f"{block}.out_norm.gated"
    inner = tuple(b.name for b in plan.buffers if b.producer_group in {g.id for g in chain} and b.name != gated)
    merged = dataclasses.replace(fused_plan, buffers=fused_plan.buffers + tuple(b for b in plan.buffers
                                                                                   if b.name in inner))
    groups = [g for g in merged.groups if g.rule.startswith("fused:") and bp.node_by_id[g.nodes[0]].block == block
              and g.family in FUSED_FAMILIES]
    fused = tuple(launch for g in groups for launch in lower_group(LowerCtx(merged), g))
    edges = {"q": "q.q", "k": "k.k", "v": "v.v", "f_a": "f_a.fa", "g_a": "g_a.ga", "b": "b.b"}
    return ProductChain(block, plan, unfused, merged, fused, {n: f"{block}.{e}" for n, e in edges.items()},
                        inner, gated)


def bind(launch: Launch, plan: Plan, arrays: dict) -> tuple:
    """A product launch's arguments with every arena buffer, weight and state buffer replaced by the
    device array of that name in `arrays` (plus the launch's offset into the buffer)."""
    base = {b.name: b.offset for b in plan.buffers}
    out = []
    for a in launch.args:
        if isinstance(a, ArenaPtr):
            arr = arrays[a.buffer]
            out.append(int(arr.gpudata) + a.offset - base[a.buffer])
        elif isinstance(a, (WeightPtr, StatePtr)):
            out.append(arrays[a.name])
        elif isinstance(a, (IntLit, FloatLit)):
            out.append(a.value)
        elif isinstance(a, NullPtr):
            out.append(None)
        else:
            raise TypeError(f"the KDA chain's launches take no {type(a).__name__} argument")
    return tuple(out)


DTYPE = {"bf16": np.uint16, "f32": np.float32}


def chain_sides(g, chain: ProductChain, rng) -> tuple[KdaLayerData, list, dict]:
    """Random layer data (random gate values), the chain's output and kept-intermediate buffers, and
    per side ("unfused", "fused") its launches, plan and device arrays by name (the weights shared,
    each side its own window and state)."""
    data = KdaLayerData.random(rng, chain.dims, integer_gates=False)
    weights = {n: g.to_gpu(v) for n, v in data.named_weights(chain.block).items()}
    window, state = chain.state_names
    outputs = [b for b in chain.plan.buffers if b.name in chain.inner + (chain.gated,)]
    sides = {side: (launches, p, {**weights, window: g.to_gpu(data.window), state: g.to_gpu(data.state)})
             for side, launches, p in (("unfused", chain.unfused, chain.plan), ("fused", chain.fused, chain.merged))}
    return data, outputs, sides


def assert_sides_equal(g, chain: ProductChain, rng, steps: int, launcher) -> None:
    """Run the chain's unfused and fused product launches on the same fresh random inputs for
    `steps` tokens (each side its own window and state, outputs poisoned before every token) and
    assert the same bits in every output and kept intermediate, and every few tokens in the window
    and the state. g: kbpc.testing.gpu; launcher: kbpc.testing.launchers.launcher."""
    data, outputs, sides = chain_sides(g, chain, rng)
    window, state = chain.state_names
    for step in range(steps):
        ins = {chain.inputs[n]: g.to_gpu(v) for n, v in data.step_inputs(rng).items()}
        names = [b.name for b in outputs] + ([window, state] if step % 8 == 7 or chain.dims.hv < 8 else [])
        got = {}
        for side, (launches, p, arrays) in sides.items():
            arrays.update(ins)
            arrays.update({b.name: g.poisoned((b.elements,), DTYPE[b.format]) for b in outputs})
            for launch in launches:
                launcher(launch.instance)(launch.grid, launch.block, *bind(launch, p, arrays), smem=launch.smem)
            got[side] = {name: g.fetch(arrays[name], f"{side} {name}") for name in names}
        for name, value in got["unfused"].items():
            np.testing.assert_array_equal(got["fused"][name], value, f"{name} at step {step}")
