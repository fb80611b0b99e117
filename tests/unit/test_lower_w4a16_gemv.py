"""Lowering of w4a16_gemv groups on the tiny blueprint: the one-row GEMV, the segmented KDA
projections (table passed by value) and the shared expert's two-phase pair, in numerics `exact`
(the chunk-walk kernels) and `fast` (the FP16 tensor-core forms where the shape allows)."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import Aggregate, lit
from kbpc.codegen.context import flt
from kbpc.codegen.families import w4a16_gemv
from kbpc.codegen.families._projection import linears, prefetch_row_bytes
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"
RULES = {"glm_w4a16_gemv_1row", "glm_w4a16_pipe_kda_six_1row", "glm_w4a16_pipe_shared_1row"}


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path), numerics="exact")


@pytest.fixture(scope="module")
def tiny_fast(tiny_path):
    return planned(str(tiny_path), numerics="fast")


def _groups(plan, rule):
    return [g for g in family_groups(plan, "w4a16_gemv") if g.rule == rule]


def test_rules_covered(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "w4a16_gemv")
    assert {g.rule for g in groups} == RULES
    for g in groups:
        launches = w4a16_gemv.lower(ctx, g)
        assert launches and all(l.block == (256, 1, 1) and l.smem == 0 and l.group == g.id for l in launches)
        assert unwritten(plan, g, launches) == []


def test_one_row(tiny):
    plan, ctx = tiny
    for g in _groups(plan, "glm_w4a16_gemv_1row"):
        (launch,) = w4a16_gemv.lower(ctx, g)
        node = plan.blueprint.node_by_id[g.nodes[0]]
        x, y = ctx.input(node), ctx.output(node)
        assert launch.instance.kernel == f"kbp::w4a16_gemv<{x.dim_value}>"
        assert launch.grid == (-(-y.dim_value // 16), 1, 1)
        assert launch.args == (ctx.weight(node), ctx.weight(node, "weight_scale"),
                               ctx.weight_value(node, "weight_scale_2"), ctx.buf(x), ctx.buf(y), lit(y.dim_value))


def test_segments(tiny):
    plan, ctx = tiny
    for g in _groups(plan, "glm_w4a16_pipe_kda_six_1row"):
        (launch,) = w4a16_gemv.lower(ctx, g)
        nodes = [plan.blueprint.node_by_id[n] for n in g.nodes]
        k = ctx.input(nodes[0]).dim_value
        assert launch.instance.kernel == f"kbp::w4a16_gemv_seg_list<{k}, {len(nodes)}>"
        assert launch.instance.params == (f"kbp::W4A16SegList<{len(nodes)}>", f"const {BF}*")
        ns = [ctx.output(n).dim_value for n in nodes]
        assert launch.grid == (sum(-(-n // 16) for n in ns), 1, 1)
        table, x = launch.args
        assert x == ctx.buf(ctx.input(nodes[0]))
        for node, n in zip(nodes, ns):   # each segment: codes, scales, y, s_g, n in W4A16Seg order
            seg = Aggregate("kbp::W4A16Seg", (ctx.weight(node), ctx.weight(node, "weight_scale"),
                                              ctx.buf(ctx.output(node)), ctx.weight_value(node, "weight_scale_2"),
                                              lit(n)))
            assert table.ctype == f"kbp::W4A16SegList<{len(nodes)}>" and seg in table.fields[0].fields


def test_more_segments_than_one_launch_holds(tiny, monkeypatch):
    plan, ctx = tiny
    g = _groups(plan, "glm_w4a16_pipe_kda_six_1row")[0]
    monkeypatch.setattr(w4a16_gemv, "MAX_SEGS", 4)
    launches = w4a16_gemv.lower(ctx, g)
    assert [len(l.nodes) for l in launches] == [4, 2]
    assert launches[1].instance.kernel.endswith(", 2>")
    assert unwritten(plan, g, launches) == []


def test_shared_pair(tiny):
    plan, ctx = tiny
    for g in _groups(plan, "glm_w4a16_pipe_shared_1row"):
        phase0, phase1 = w4a16_gemv.lower(ctx, g)
        nodes = {plan.blueprint.node_by_id[n].op_base: plan.blueprint.node_by_id[n] for n in g.nodes}
        gate_up = next(plan.blueprint.node_by_id[n] for n in g.nodes if n.endswith("gate_up"))
        down = next(plan.blueprint.node_by_id[n] for n in g.nodes if n.endswith("down"))
        assert {"swiglu_clamp", "silu_mul", "linear"} <= set(nodes)
        k, i = ctx.input(gate_up).dim_value, ctx.input(down).dim_value
        n = ctx.output(down).dim_value
        assert ctx.output(gate_up).dim_value == 2 * i
        assert phase0.instance == phase1.instance   # one TU: the scratch is shared by both phases
        assert phase0.instance.kernel == f"kbp::w4a16_shared_pair<{k}, {i}>"
        assert phase0.args[0] == lit(0) and phase1.args[0] == lit(1) and phase0.args[1:] == phase1.args[1:]
        assert phase0.grid == (-(-2 * i // 16), 1, 1) and phase1.grid == (-(-n // 16), 1, 1)
        assert phase0.args[1:5] == (ctx.weight(gate_up), ctx.weight(gate_up, "weight_scale"),
                                    ctx.weight_value(gate_up, "weight_scale_2"), ctx.buf(ctx.input(gate_up)))
        assert phase0.args[5:8] == (ctx.weight(down), ctx.weight(down, "weight_scale"),
                                    ctx.weight_value(down, "weight_scale_2"))
        assert phase0.args[8] == flt(plan.blueprint.config.constants.swiglu_limit)
        assert points_into(phase0.args[9], f"{down.id}.{ctx.output(down).id.rsplit('.', 1)[-1]}")
        assert phase0.args[10] == lit(n)


def test_fast_forms(tiny_fast):
    """numerics fast: one linear and segments on w4a16_mma (KS, T from mma_shape), same arguments;
    the shared-expert pair on w4a16_mma_shared_pair (test_fast_shared_pair)."""
    plan, ctx = tiny_fast
    for g in family_groups(plan, "w4a16_gemv"):
        launches = w4a16_gemv.lower(ctx, g)
        assert unwritten(plan, g, launches) == []
        nodes = [plan.blueprint.node_by_id[n] for n in g.nodes]
        if g.rule == "glm_w4a16_pipe_shared_1row":
            continue
        k = ctx.input(nodes[0]).dim_value
        ns = [ctx.output(n).dim_value for n in nodes]
        ks, t = w4a16_gemv.mma_shape(sum(-(-n // 16) for n in ns), k)
        if len(nodes) == 1:
            ks, t = w4a16_gemv.one_wave(-(-ns[0] // 16), ks, t, 132)
        pf = prefetch_row_bytes(ctx, sum(ns), k // 2, 1 / 8)
        (launch,) = launches
        assert launch.instance.header == "w4a16_mma.cuh" and launch.block == (32 * ks * t, 1, 1)
        assert launch.grid == (sum(-(-n // (16 * t)) for n in ns), 1, 1)
        if len(nodes) == 1:
            assert launch.instance.kernel == f"kbp::w4a16_mma<{k}, {ks}, {t}, {pf}>"
            assert launch.args[3:] == (ctx.buf(ctx.input(nodes[0])), ctx.buf(ctx.output(nodes[0])), lit(ns[0]))
        else:
            assert launch.instance.kernel == f"kbp::w4a16_mma_seg_list<{k}, {ks}, {t}, {len(nodes)}, {pf}>"


def test_fast_shared_pair_is_the_fast_default(tiny, tiny_fast, monkeypatch):
    """Fast mode lowers the tensor-core pair by default (SHARED_PAIR_FAST), exact mode the exact
    pair; with SHARED_PAIR_FAST off fast mode lowers the exact pair too."""
    plan, ctx = tiny_fast
    plan_x, ctx_x = tiny
    groups = _groups(plan, "glm_w4a16_pipe_shared_1row")
    assert groups
    for g in groups:
        exact = w4a16_gemv.lower(ctx_x, next(e for e in _groups(plan_x, g.rule) if e.id == g.id))
        assert {l.instance.kernel.split("<")[0] for l in exact} == {"kbp::w4a16_shared_pair"}
        assert {l.instance.kernel.split("<")[0] for l in w4a16_gemv.lower(ctx, g)} == {"kbp::w4a16_mma_shared_pair"}
        monkeypatch.setattr(w4a16_gemv, "SHARED_PAIR_FAST", False)
        assert [l.instance for l in w4a16_gemv.lower(ctx, g)] == [l.instance for l in exact]
        monkeypatch.undo()


def test_fast_shared_pair(tiny, tiny_fast, monkeypatch):
    """With SHARED_PAIR_FAST: the pair's instance is w4a16_mma_shared_pair<K, I, KS0, T0, KS1, T1> (phase 0:
    I/8 tiles of 8 gate + 8 up rows, phase 1: the down tiles, each shape from mma_shape), launched
    twice with the exact pair's arguments (only the instance, grids and blocks differ)."""
    monkeypatch.setattr(w4a16_gemv, "SHARED_PAIR_FAST", True)
    plan, ctx = tiny_fast
    plan_x, ctx_x = tiny
    for g in _groups(plan, "glm_w4a16_pipe_shared_1row"):
        phase0, phase1 = w4a16_gemv.lower(ctx, g)
        exact0, exact1 = w4a16_gemv.lower(ctx_x, next(e for e in _groups(plan_x, g.rule) if e.id == g.id))
        gate_up, down = linears(ctx, g)
        k, i, n = ctx.input(gate_up).dim_value, ctx.input(down).dim_value, ctx.output(down).dim_value
        ks0, t0, ks1, t1 = w4a16_gemv.pair_shapes(k, i, n)
        assert (ks0, t0) == w4a16_gemv.mma_shape(i // 8, k) and (ks1, t1) == w4a16_gemv.mma_shape(-(-n // 16), i)
        assert phase0.instance == phase1.instance
        assert phase0.instance.header == "w4a16_mma.cuh"
        assert phase0.instance.kernel == f"kbp::w4a16_mma_shared_pair<{k}, {i}, {ks0}, {t0}, {ks1}, {t1}>"
        assert phase0.instance.params == exact0.instance.params
        assert phase0.grid == (-(-i // (8 * t0)), 1, 1) and phase0.block == (32 * ks0 * t0, 1, 1)
        assert phase1.grid == (-(-n // (16 * t1)), 1, 1) and phase1.block == (32 * ks1 * t1, 1, 1)
        assert (phase0.args, phase1.args) == (exact0.args, exact1.args)
        assert unwritten(plan, g, [phase0, phase1]) == []


def test_fast_shared_pair_falls_back(tiny_fast, monkeypatch):
    """Where I (the down projection's K) misses the tensor-core form's limits, the whole pair keeps
    the exact kernel; so it does where K does."""
    plan, ctx = tiny_fast
    monkeypatch.setattr(w4a16_gemv, "SHARED_PAIR_FAST", True)
    g = _groups(plan, "glm_w4a16_pipe_shared_1row")[0]
    gate_up, down = linears(ctx, g)
    k, i = ctx.input(gate_up).dim_value, ctx.input(down).dim_value
    exact = [w4a16_gemv.pair_instance(k, i)] * 2
    for missing in (i, k):   # the one size that misses the limits
        monkeypatch.setattr(w4a16_gemv, "_fast", lambda _ctx, size, missing=missing: size != missing)
        assert [l.instance for l in w4a16_gemv.lower(ctx, g)] == exact
    monkeypatch.undo()
    monkeypatch.setattr(w4a16_gemv, "SHARED_PAIR_FAST", True)
    monkeypatch.setattr(w4a16_gemv, "MMA_MAX_K", min(i, k) - 1)
    assert [l.instance for l in w4a16_gemv.lower(ctx, g)] == exact
    monkeypatch.undo()   # the split act row (hi and lo FP16 parts) takes twice the staging: I's own limit
    monkeypatch.setattr(w4a16_gemv, "MMA_SPLIT_MAX_K", i - 1)
    assert [l.instance for l in w4a16_gemv.lower(ctx, g)] == exact


def test_seed_shared_pair_shapes(seed_path, monkeypatch):
    """The seed's shared experts (K 4096, I 2048, N 4096): 256 CTAs of 8 warps in both phases."""
    monkeypatch.setattr(w4a16_gemv, "SHARED_PAIR_FAST", True)
    plan, ctx = planned(str(seed_path), numerics="fast")
    g = _groups(plan, "glm_w4a16_pipe_shared_1row")[0]
    phase0, phase1 = w4a16_gemv.lower(ctx, g)
    assert phase0.instance.kernel == "kbp::w4a16_mma_shared_pair<4096, 2048, 8, 1, 8, 1>"
    assert (phase0.grid, phase0.block, phase1.grid, phase1.block) == ((256, 1, 1), (256, 1, 1), (256, 1, 1),
                                                                      (256, 1, 1))


@pytest.mark.parametrize("tiles,k", [(512, 4096), (256, 8192), (1556, 4096), (1, 32), (8, 20480), (3000, 128)])
def test_mma_shape(tiles, k):
    ks, t = w4a16_gemv.mma_shape(tiles, k)
    assert ks in (1, 2, 4, 8, 16) and ks <= max(1, -(-k // 128)) and t >= 1 and ks * t <= 16
    assert tiles * ks <= max(w4a16_gemv.MMA_WARPS, tiles)


def test_one_wave():
    """KS is halved only where that turns a launch of two guaranteed waves into one: the seed's KDA
    output projection (256 tiles of depth 8192: KS 16 gives one 512-thread CTA an SM, two waves on
    132 SMs; KS 8 two CTAs an SM, one wave), not where it would not fit anyway or already does."""
    assert w4a16_gemv.mma_shape(256, 8192) == (16, 1)
    assert w4a16_gemv.one_wave(256, 16, 1, 132) == (8, 1)
    assert w4a16_gemv.one_wave(128, 16, 1, 132) == (16, 1)      # one wave already
    assert w4a16_gemv.one_wave(1556, 4, 2, 132) == (4, 2)       # still several waves at KS 2
    assert w4a16_gemv.one_wave(600, 16, 1, 132) == (16, 1)      # KS 8 would still be three waves
    # W4A16F_MIN_CTAS in kernels/w4a16_mma.cuh: 16 warps an SM, at least one CTA
    assert [w4a16_gemv.min_ctas(w) for w in (1, 2, 4, 8, 12, 16)] == [16, 8, 4, 2, 1, 1]


def test_fast_falls_back_where_the_shape_does_not_fit(tiny_fast, monkeypatch):
    plan, ctx = tiny_fast
    monkeypatch.setattr(w4a16_gemv, "MMA_MAX_K", 16)
    for g in family_groups(plan, "w4a16_gemv"):
        assert all(l.instance.header == "w4a16_gemv.cuh" for l in w4a16_gemv.lower(ctx, g))


def test_seed_projection_families(seed_path):
    """Every group of the five projection families in the seed lowers and writes its outputs."""
    from kbpc.codegen.families import w4a4_mx, w4a4_mx_static, w8a8_act_quant, wxay  # noqa: PLC0415
    plan, ctx = planned(str(seed_path))
    modules = {"w4a16_gemv": w4a16_gemv, "w4a4_mx": w4a4_mx, "w4a4_mx_static": w4a4_mx_static,
               "wxay": wxay, "w8a8_act_quant": w8a8_act_quant}
    for family, module in modules.items():
        groups = family_groups(plan, family)
        assert groups, family
        for g in groups:
            launches = module.lower(ctx, g)
            assert unwritten(plan, g, launches) == [], (family, g.rule)
            assert all(0 < l.grid[0] < 2 ** 31 and 0 < l.grid[1] < 65536 for l in launches)


def test_prefetch_budget(tiny_fast):
    """prefetch_row_bytes: whole lines, never past a row, at most the target's budget for the launch,
    none without PDL (no window before the dependency wait)."""
    import dataclasses

    from kbpc.codegen.context import LowerCtx
    from kbpc.targets import get_target

    plan, ctx = tiny_fast
    assert prefetch_row_bytes(ctx, 16, 1536) == 0    # sm_90 has no budget (measured slower with one)
    plan = dataclasses.replace(plan, options=dataclasses.replace(plan.options, target="sm_100"))
    ctx = LowerCtx(plan)
    budget = get_target(plan.options.target).l2_prefetch_bytes
    assert budget > 0
    for rows, row_bytes, side in [(4096, 4096, 1 / 8), (16, 1536, 0.0), (24576, 2048, 1 / 8), (1, 100, 0.0)]:
        pf = prefetch_row_bytes(ctx, rows, row_bytes, side)
        assert pf % 128 == 0 and 0 <= pf <= row_bytes
        assert pf * rows * (1 + side) <= budget
    assert prefetch_row_bytes(ctx, 16, 1536) == 1536                         # small: all of it
    assert prefetch_row_bytes(ctx, 24576, 2048, 1 / 8) == budget // (24576 * 9 // 8) // 128 * 128
    nopdl = dataclasses.replace(plan, options=dataclasses.replace(plan.options, pdl=False))
    assert prefetch_row_bytes(LowerCtx(nopdl), 4096, 4096, 1 / 8) == 0
