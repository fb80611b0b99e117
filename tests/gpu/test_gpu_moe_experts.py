"""GPU tests of kernels/moe_experts.cuh through the product's launchers (the lowering's instances,
kbpc/codegen/families/moe_experts.py), bit for bit against the unfused kernels on the same inputs
and, where the reference is exact, against kbpc.reference:
- moe_gate_up_pair (rule moe_gate_up_pair): the down input's NVFP4 rows equal what
  w4a4_gemv_moe_slots then w4a4_quant_swiglu_rows_static write (exact: also the reference's slot
  GEMV, clamped SwiGLU and static quantization), an empty slot included, in both numerics forms;
- moe_router_shared + moe_gate_up_shared_down (rule moe_experts): the router's outputs equal
  router_gemv_topk_quant's, the [gate | up] rows w4a4_gemv_moe_slots', the shared expert's output
  w4a16_shared_pair's (the shared pair's own silu uses expf: against the reference within its
  tolerance, as tests/gpu/test_gpu_glue_projections.py checks the pair);
- moe_expert_flow (rule moe_expert_flow): the down input's NVFP4 rows and the down's output equal
  the unfused chain's (w4a4_gemv_moe_slots, w4a4_quant_swiglu_rows_static, the down's slot GEMV;
  exact: also the reference), an empty slot included, in both numerics forms, at grids of one
  wave up to several waves of CTAs, three launches on the same sync state (which every launch
  leaves zero); moe_gate_up_flow (rule moe_gate_up_flow): the down input's rows likewise."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import glm_router_topk, moe_experts, w4a4_mx_static
from kbpc.codegen.families._projection import BLOCK
from kbpc.codegen.families.w4a4_mx_static import quant_swiglu_grid
from kbpc.reference import glm_swiglu_clamp as ref_clamp
from kbpc.reference import w4a4_mx_static as ref_w4a4s
from kbpc.reference import w4a16_gemv as ref_w4a16
from kbpc.reference.formats import bf16_bits, quantize_nvfp4_static
from kbpc.reference.glm_swiglu_clamp import swiglu_clamp_rows
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

# The projection tests' inputs and checks (tests/gpu is on sys.path).
from test_gpu_projections import RNG, _gpu, assert_bf16_close, assert_bf16_equal, bf16_input, nvfp4_weight

pytestmark = pytest.mark.gpu
LIMIT = np.float32(7.0)

PAIR_SIZES = [(4096, 2048, 10, 8), (2176, 48, 5, 4), (1024, 3584, 6, 6), (128, 16, 3, 2)]   # (k, i, experts, top_k)
FLOW_SIZES = [(4096, 2048, 4096, 10, 8), (256, 128, 272, 6, 3), (1024, 384, 512, 6, 6),   # (k, i, n, E, top_k)
              (512, 256, 4096, 40, 32)]
LAYER_SIZES = [(4096, 2048, 2048, 4096, 10, 8), (256, 128, 48, 256, 128, 8),              # (k, i, ish, n, E, top_k)
               (512, 256, 64, 384, 8, 4)]


def instances():
    """Every kernel instance this module launches (tests/nvcc/test_gpu_test_instances.py builds them)."""
    out = []
    for fast in (False, True):
        out += [moe_experts.pair_instance(k, i, fast) for k, i, *_ in PAIR_SIZES]
        out += [w4a4_mx_static.slots_instance(k, fast) for k, *_ in PAIR_SIZES]
        out += [moe_experts.gate_up_shared_down_instance(k, ish, n, fast) for k, _, ish, n, *_ in LAYER_SIZES]
        out += [w4a4_mx_static.slots_instance(k, fast) for k, *_ in LAYER_SIZES]
        out += [moe_experts.flow_instance(k, i, n, fast, w4a4_mx_static.slot_tiles(i, n)) for k, i, n, *_ in FLOW_SIZES]
        out += [moe_experts.gate_up_flow_instance(k, i, fast) for k, i, *_ in FLOW_SIZES]
        out += [w4a4_mx_static.slots_instance(k, fast) for k, *_ in FLOW_SIZES]
        out += [w4a4_mx_static.slots_instance(i, fast, w4a4_mx_static.slot_tiles(i, n)) for _, i, n, *_ in FLOW_SIZES]
    out += [w4a4_mx_static.quant_swiglu_instance(i) for _, i, *_ in FLOW_SIZES]
    out += [moe_experts.router_shared_instance(k, e, t, ish) for k, _, ish, _, e, t in LAYER_SIZES]
    out += [glm_router_topk.fused_quant_instance(k, e, t) for k, _, _, _, e, t in LAYER_SIZES]
    out += [w4a4_mx_static.quant_swiglu_instance(i) for _, i, *_ in PAIR_SIZES + LAYER_SIZES]
    return out + [ki.w4a16_shared_pair(k, ish) for k, _, ish, *_ in LAYER_SIZES]


def _experts(count: int, n: int, k: int):
    stack = [nvfp4_weight(n, k) for _ in range(count)]
    return (np.stack([p for p, _, _ in stack]), np.stack([s for _, s, _ in stack]),
            np.array([g for _, _, g in stack], np.float32))


def _ids(experts: int, top_k: int) -> np.ndarray:
    ids = RNG.choice(experts, top_k, replace=False).astype(np.int32)
    ids[RNG.integers(top_k)] = -1   # an empty slot: +0 rows
    return ids


class _Routed:
    """One token's routed inputs on the GPU and the unfused chain's down input from them."""

    def __init__(self, g, k, i, experts, top_k, fast):
        self.g, self.k, self.i, self.top_k, self.fast = g, k, i, top_k, fast
        self.weights, self.ids = _experts(experts, 2 * i, k), _ids(experts, top_k)
        self.x = bf16_input((1, k))
        self.gamma_in = np.float32(np.abs(self.x).max() / 2688)
        xc, xs, xg = quantize_nvfp4_static(self.x, self.gamma_in)
        self.gu_ref = ref_w4a4s.w4a4_static_moe_slots(np.repeat(self.x, top_k, 0), self.gamma_in, *self.weights,
                                                      self.ids)
        h = swiglu_clamp_rows(self.gu_ref, LIMIT)
        self.gamma = np.float32(max(np.abs(h).max(), 1e-3) / 2688)
        self.h_ref = quantize_nvfp4_static(h, self.gamma)
        wp, ws, wg = self.weights
        self.args = [g.to_gpu(self.ids), np.int32(top_k), g.to_gpu(xc), g.to_gpu(xs),
                     g.to_gpu(np.asarray(xg, np.float32).reshape(-1)), g.to_gpu(wp), g.to_gpu(ws), g.to_gpu(wg)]

    def outputs(self):
        g, t, i = self.g, self.top_k, self.i
        return (g.poisoned((t, i // 2), np.uint8), g.poisoned((t, i // 16), np.uint8), g.poisoned((t,), np.float32))

    def unfused(self):
        """w4a4_gemv_moe_slots (the step's form for the numerics) then w4a4_quant_swiglu_rows_static."""
        g, t, i = self.g, self.top_k, self.i
        gu = g.poisoned((t, 2 * i), np.uint16)
        launcher(w4a4_mx_static.slots_instance(self.k, self.fast))((2 * i // 16, t, 1), BLOCK, *self.args, gu,
                                                                   np.int32(2 * i), pdl=True)
        c, s, a = self.outputs()
        launcher(w4a4_mx_static.quant_swiglu_instance(i))(quant_swiglu_grid(i, t), BLOCK, gu, LIMIT, self.gamma,
                                                          c, s, a, pdl=True)
        return gu, (c, s, a)


def _same_rows(got, want, what):
    (c, s, a), (wc, ws, wa) = got, want
    assert np.array_equal(c.get(), wc.get()), f"{what}: codes differ"
    assert np.array_equal(s.get(), ws.get()), f"{what}: scales differ"
    assert np.array_equal(a.get(), wa.get()), f"{what}: global scales differ"


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("k,i,experts,top_k", PAIR_SIZES)
def test_gate_up_pair(k, i, experts, top_k, fast):
    g = _gpu()
    r = _Routed(g, k, i, experts, top_k, fast)
    gu, want = r.unfused()
    if not fast:   # the unfused chain is the reference's bytes
        assert_bf16_equal(g.fetch(gu, "gu"), r.gu_ref, f"gate/up rows k={k} i={i}")
        packed, scales, _ = r.h_ref
        assert np.array_equal(want[0].get(), packed) and np.array_equal(want[1].get(), scales)
    for run in range(2):   # no state carried between launches
        got = r.outputs()
        launcher(moe_experts.pair_instance(k, i, fast))((i // 16, top_k, 1), moe_experts.PAIR_BLOCK, *r.args, LIMIT,
                                                        r.gamma, *got, pdl=True)
        _same_rows(got, want, f"pair k={k} i={i} fast={fast} run {run}")


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("k,i,n,experts,top_k", FLOW_SIZES)
def test_expert_flow(k, i, n, experts, top_k, fast):
    """moe_expert_flow against the unfused chain on the same inputs, three launches on one sync
    state: the down input's rows and the down's output bit for bit, the words and counters back
    to zero after each launch (exact: the down's output is also the reference's)."""
    g = _gpu()
    r = _Routed(g, k, i, experts, top_k, fast)
    _, want_h = r.unfused()
    dn = _experts(experts, n, i)
    dn_dev = [g.to_gpu(a) for a in dn]
    tiles = w4a4_mx_static.slot_tiles(i, n)
    want_y = g.poisoned((top_k, n), np.uint16)
    launcher(w4a4_mx_static.slots_instance(i, fast, tiles))((n // (16 * tiles), top_k, 1), BLOCK, r.args[0],
                                                            np.int32(1), *want_h, *dn_dev, want_y, np.int32(n),
                                                            pdl=True)
    if not fast:
        h = swiglu_clamp_rows(r.gu_ref, LIMIT)
        assert_bf16_equal(g.fetch(want_y, "y"), ref_w4a4s.w4a4_static_moe_slots(h, r.gamma, *dn, r.ids),
                          f"unfused down k={k} i={i} n={n}")
    words = g.to_gpu(np.zeros((top_k, 2 * i), np.uint32))
    sync = g.to_gpu(np.zeros(1 + 2 * top_k, np.uint32))
    units = top_k * moe_experts.flow_units_per_slot(i, n, tiles)
    for run in range(3):
        got_h, got_y = r.outputs(), g.poisoned((top_k, n), np.uint16)
        launcher(moe_experts.flow_instance(k, i, n, fast, tiles))((units, 1, 1), BLOCK, *r.args, LIMIT, r.gamma,
                                                                  *got_h, *dn_dev, got_y, words, sync, pdl=True)
        what = f"flow k={k} i={i} n={n} fast={fast} run {run}"
        _same_rows(got_h, want_h, what)
        assert np.array_equal(g.fetch(got_y, "y"), g.fetch(want_y, "y")), f"{what}: down output differs"
        assert not words.get().any() and not sync.get().any(), f"{what}: the sync state is not left zero"


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("k,i,n,experts,top_k", FLOW_SIZES)
def test_gate_up_flow(k, i, n, experts, top_k, fast):
    """moe_gate_up_flow against the unfused gate/up GEMV and SwiGLU quantizer on the same inputs,
    three launches on one sync state: the down input's rows bit for bit, the words and the ticket
    back to zero after each launch."""
    g = _gpu()
    r = _Routed(g, k, i, experts, top_k, fast)
    _, want_h = r.unfused()
    words = g.to_gpu(np.zeros((top_k, 2 * i), np.uint32))
    sync = g.to_gpu(np.zeros(1 + 2 * top_k, np.uint32))
    units = top_k * (2 * i // 16 + -(-i // 256))
    for run in range(3):
        got_h = r.outputs()
        launcher(moe_experts.gate_up_flow_instance(k, i, fast))((units, 1, 1), BLOCK, *r.args, LIMIT, r.gamma,
                                                                *got_h, words, sync, pdl=True)
        what = f"gate/up flow k={k} i={i} fast={fast} run {run}"
        _same_rows(got_h, want_h, what)
        assert not words.get().any() and not sync.get().any(), f"{what}: the sync state is not left zero"


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("k,i,ish,n,experts,top_k", LAYER_SIZES)
def test_router_and_gate_up_with_the_shared_expert(k, i, ish, n, experts, top_k, fast):
    """moe_router_shared then moe_gate_up_shared_down against router_gemv_topk_quant, the routed
    gate/up slot GEMV and the shared pair's two phases on the same inputs: every byte equal (the
    router's logits, ids, weights and quantized row; the [gate | up] rows; the shared output), twice
    in a row (the router's arrival counter returns to zero)."""
    g = _gpu()
    router_w = bf16_input((experts, k), 0.05)
    bias = (RNG.standard_normal(experts) * 0.01).astype(np.float32)
    x = bf16_input((1, k))
    gamma_in = np.float32(np.abs(x).max() / 2688)
    gu_w, sgu, sdn = _experts(experts, 2 * i, k), nvfp4_weight(2 * ish, k), nvfp4_weight(n, ish)
    dev = {name: g.to_gpu(a) for name, a in (("rw", bf16_bits(router_w)), ("bias", bias), ("x", bf16_bits(x[0])),
                                             ("gp", gu_w[0]), ("gs", gu_w[1]), ("gg", gu_w[2]), ("sp", sgu[0]),
                                             ("ss", sgu[1]), ("dp", sdn[0]), ("ds", sdn[1]))}

    def router_outputs():
        return [g.poisoned((experts,), np.float32), g.to_gpu(np.zeros(1, np.uint32)),
                g.poisoned((top_k,), np.float32), g.poisoned((top_k,), np.int32),
                g.poisoned((k // 2,), np.uint8), g.poisoned((k // 16,), np.uint8), g.poisoned((1,), np.float32)]

    def router_args(out):
        logits, arrive, weights, ids, codes, scales, ag = out
        return [dev["rw"], dev["x"], dev["bias"], np.float32(2.5), logits, arrive, weights, ids, gamma_in, codes,
                scales, ag]

    def gate_up_args(out, gu):
        ids, codes, scales, ag = out[3], out[4], out[5], out[6]
        return [ids, np.int32(top_k), codes, scales, ag, dev["gp"], dev["gs"], dev["gg"], gu, np.int32(2 * i)]

    # unfused: the fused router, the slot GEMV, the shared pair's two phases
    want = router_outputs()
    opc = glm_router_topk.fused_outputs_per_cta(experts)
    launcher(glm_router_topk.fused_quant_instance(k, experts, top_k))((-(-experts // opc), 1, 1), (64 * opc, 1, 1),
                                                                      *router_args(want), pdl=True)
    gu_want = g.poisoned((top_k, 2 * i), np.uint16)
    launcher(w4a4_mx_static.slots_instance(k, fast))((2 * i // 16, top_k, 1), BLOCK, *gate_up_args(want, gu_want),
                                                     pdl=True)
    pair_args = [dev["sp"], dev["ss"], np.float32(sgu[2]), dev["x"], dev["dp"], dev["ds"], np.float32(sdn[2]), LIMIT]
    sy_want = g.poisoned((n,), np.uint16)
    run_pair = launcher(ki.w4a16_shared_pair(k, ish))
    run_pair(((2 * ish + 15) // 16, 1, 1), BLOCK, np.int32(0), *pair_args, sy_want, np.int32(n))
    run_pair(((n + 15) // 16, 1, 1), BLOCK, np.int32(1), *pair_args, sy_want, np.int32(n))
    ropc = moe_experts.router_opc(experts)
    for run in range(2):
        got, sh_x = router_outputs(), g.poisoned((ish,), np.float32)
        launcher(moe_experts.router_shared_instance(k, experts, top_k, ish))(
            (-(-experts // ropc) + ish // (2 * ropc), 1, 1), (64 * ropc, 1, 1), *router_args(got), dev["sp"],
            dev["ss"], np.float32(sgu[2]), LIMIT, sh_x, pdl=True)
        for what, a, b in zip(("logits", "arrive", "weights", "ids", "codes", "scales", "g"), got, want):
            assert np.array_equal(a.get(), b.get()), f"router {what} run {run}"
        gu, sy = g.poisoned((top_k, 2 * i), np.uint16), g.poisoned((n,), np.uint16)
        launcher(moe_experts.gate_up_shared_down_instance(k, ish, n, fast))(
            (n // 16 + top_k * (2 * i // 16), 1, 1), BLOCK, *gate_up_args(got, gu), sh_x, dev["dp"], dev["ds"],
            np.float32(sdn[2]), sy, pdl=True)
        assert np.array_equal(g.fetch(gu, "gu"), g.fetch(gu_want, "gu")), f"[gate | up] rows run {run}"
        assert np.array_equal(g.fetch(sy, "shared y"), g.fetch(sy_want, "shared y")), f"shared expert run {run}"
    gh, uh = ref_clamp.split_gate_up(ref_clamp.clamp_gate_up(ref_w4a16.w4a16_gemv(x[0], *sgu)[0], LIMIT))
    assert_bf16_close(g.fetch(sy)[None], ref_w4a16.w4a16_gemv_silu_input(gh, uh, *sdn), "shared expert", 0.99)
