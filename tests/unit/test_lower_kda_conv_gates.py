"""The default fused KDA forms (fusion rules kda_conv_gates and kda_recurrence_norm) on the tiny
example and the seed: every KDA layer's pack, conv and gate groups become one side-by-side launch and
its recurrence and gated norm one launch, on one stream with no event wait between them (the
recurrence follows one kernel); the launches' shapes and arguments; kept intermediates are written;
the rules refuse what their kernels cannot serve; the product chain binds every argument."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import NULL, ArenaPtr, StatePtr, WeightPtr
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.emit import build_step
from kbpc.codegen.families import causal_conv1d_l2norm, kda_conv_gates, kda_recurrent
from kbpc.codegen.families.kda_gates_w8a8 import gate_blocks
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.testing.kda_chain import bind, product_chain
from kbpc.testing.lowering import points_into


@pytest.mark.parametrize("which", ["tiny", "seed"])
def test_every_kda_layer_is_two_launches_on_one_stream(which, tiny_path, seed_path):
    bp = load_blueprint(tiny_path if which == "tiny" else seed_path)
    plan = run_pipeline(bp, Options())
    layers = sum(n.op == "gdn_recurrence" for n in bp.nodes())
    conv_gates = [g for g in plan.groups if g.rule == "fused:kda_conv_gates"]
    recur = [g for g in plan.groups if g.rule == "fused:kda_recurrence_norm"]
    assert layers and len(conv_gates) == len(recur) == layers
    assert not any(g.family in ("causal_conv1d_l2norm", "kda_gates_w8a8", "kda_o_norm", "kda_pack")
                   for g in plan.groups)
    step = build_step(plan, "x")
    by_group = {g.group: g for g in step.groups}
    sym = bp.symbols
    for a, b in zip(conv_gates, recur):
        first, second = by_group[a.id], by_group[b.id]
        assert first.stream == second.stream and not second.waits   # one stream, no join
        (cg,) = first.launches
        (rn,) = second.launches
        c = 2 * sym["lin_k_heads"] * sym["lin_k_dim"] + sym["lin_v_heads"] * sym["lin_v_dim"]
        threads = causal_conv1d_l2norm.block_threads(sym["lin_k_dim"], kda_conv_gates.TARGET_THREADS)
        n = sym["lin_v_heads"] * sym["lin_k_dim"]
        assert cg.block == (threads, 1, 1) and cg.grid == (2 * gate_blocks(n, threads // 32) + -(-c // threads), 1, 1)
        assert rn.grid == (sym["lin_v_heads"], 1, 1) and rn.block == (sym["lin_v_dim"], 1, 1)
        assert rn.instance.kernel.startswith("kbp::kda_recurrent_norm_decode_bf16<")
        assert rn.args[7] == NULL   # the FP32 recurrence output stays on chip


def test_kept_intermediates_are_written(tiny_path):
    """With the chain's inner buffers put back (product_chain), the pack's copy runs first and the
    recurrence writes its FP32 output."""
    chain = product_chain(str(tiny_path), form="default")
    pack, cg, rn = chain.fused
    b = chain.block
    assert pack.instance.family == "kda_pack" and points_into(pack.args[6], f"{b}.qkv.qkv")
    assert cg.instance.family == "kda_conv_gates" and points_into(rn.args[7], f"{b}.recur.core")


def test_plain_plan_needs_no_pack(tiny_path):
    plan = run_pipeline(load_blueprint(tiny_path), Options())
    ctx = LowerCtx(plan)
    for g in (g for g in plan.groups if g.rule == "fused:kda_conv_gates"):
        (launch,) = kda_conv_gates.lower(ctx, g)
        q, k, v = launch.args[21:24]
        assert all(isinstance(a, ArenaPtr) for a in (q, k, v))


def test_rules_refuse_what_the_kernels_cannot_serve(tiny_path):
    bp = load_blueprint(tiny_path)
    nodes = [n for n in bp.nodes() if n.block == "l0.kda"]
    pick = {op: [n for n in nodes if n.op == op] for op in {n.op for n in nodes}}
    side = [n for op in ("concat", "conv1d_update", "state_snapshot", "l2_norm", "act_quant", "linear:kda_f_b",
                         "gdn_gates", "linear:kda_g_b") for n in pick[op]]
    assert kda_conv_gates.fits(bp, side) is None
    bf16_gate = dataclasses.replace(pick["linear:kda_f_b"][0], precision=dataclasses.replace(
        pick["linear:kda_f_b"][0].precision, weight="bf16"))
    assert "fp8/channel" in kda_conv_gates.fits(bp, [bf16_gate if n is pick["linear:kda_f_b"][0] else n for n in side])
    pair = pick["gdn_recurrence"] + pick["gated_rms_norm"]
    assert kda_recurrent.norm_fits(bp, pair) is None
    wide = dataclasses.replace(bp, symbols={**bp.symbols, "lin_v_dim": 2048})
    assert "1024" in kda_recurrent.norm_fits(wide, pair)


def test_skipping_the_rules_restores_the_five_kernels(tiny_path):
    bp = load_blueprint(tiny_path)
    plan = run_pipeline(bp, Options(skip_fusions=("kda_conv_gates", "kda_recurrence_norm")))
    families = {g.family for g in plan.groups}
    assert {"causal_conv1d_l2norm", "kda_gates_w8a8", "kda_o_norm", "kda_pack"} <= families
    skipped = [f for f in plan.fusions if f.rule in ("kda_conv_gates", "kda_recurrence_norm")]
    assert skipped and all(not f.applied and "skipped" in f.reason for f in skipped)


def test_product_chain_binds_every_argument(tiny_path):
    chain = product_chain(str(tiny_path), form="default")
    names = {a.buffer if isinstance(a, ArenaPtr) else a.name for launch in chain.unfused + chain.fused
             for a in launch.args if isinstance(a, (ArenaPtr, WeightPtr, StatePtr))}
    arrays = {name: _Dev((i + 1) << 32) for i, name in enumerate(sorted(names))}
    for launch in chain.fused:
        for ctype, value in zip(launch.instance.params, bind(launch, chain.merged, arrays), strict=True):
            if ctype.endswith("*"):
                assert value is None or isinstance(value, (_Dev, int)), (launch.instance.kernel, ctype, value)
            else:
                assert isinstance(value, (int, float)), (launch.instance.kernel, ctype, value)


class _Dev:
    """A stand-in device array: what bind reads of one (its address)."""
    def __init__(self, address: int):
        self.gpudata = address
