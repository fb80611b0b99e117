"""Lowering of the fused MoE layer (rule moe_layer -> family glm_moe_layer) and its launch planner:
two launches of one kbp::moe_layer instance over the whole group, arguments bound to the right
buffers and weights, the planner's K split / ring depth / shared memory / grid, and clear errors
for shapes the kernel cannot take."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import NULL, ArenaPtr, FloatLit, IntLit, WeightPtr, WeightScalar
from kbpc.codegen.context import LoweringError
from kbpc.codegen.families import glm_moe_layer as M
from kbpc.targets import get_target
from kbpc.testing.lowering import family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path), fuse=True)


def test_moe_layer_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "glm_moe_layer")
    blocks = {n.block for n in plan.blueprint.nodes() if n.block_type == "moe"}
    assert len(groups) == len(blocks) > 0
    sym = plan.blueprint.symbols
    for g in groups:
        launches = M.lower(ctx, g)
        assert [l.args[0] for l in launches] == [IntLit(0), IntLit(1)]
        assert launches[0].instance == launches[1].instance          # one TU: the phases share scratch
        assert launches[0].instance.params == M.PARAMS
        assert all(l.nodes == tuple(g.nodes) and l.block == (256, 1, 1) for l in launches)
        layer = M.plan_moe_layer(M.MoeLayerShape(sym["hidden"], sym["moe_inter"], sym["shared_inter"],
                                                 sym["experts"], sym["top_k"]), get_target("sm_90").sms)
        assert launches[0].instance.kernel == layer.kernel
        assert [(l.grid[0], l.smem) for l in launches] == [(layer.gate_up.grid, layer.gate_up.smem),
                                                            (layer.down.grid, layer.down.smem)]
        args = dict(zip(M.PARAM_NAMES, launches[0].args))
        block = plan.blueprint.node_by_id[g.nodes[0]].block
        assert isinstance(args["xn"], ArenaPtr) and args["xn"].buffer.endswith("post_norm.xn")
        assert isinstance(args["y"], ArenaPtr) and args["y"].buffer == f"{block}.blend.f"
        assert args["w_router"] == WeightPtr(args["w_router"].index, f"{block}.gate.weight", "__nv_bfloat16")
        assert args["gu_sg"].name == f"{block}.experts_gate_up.weight_scale_2" and args["gu_sg"].ctype == "float"
        assert args["gamma_gu"] == WeightScalar(args["gamma_gu"].index, f"{block}.experts_gate_up.input_scale")
        assert args["gamma_dn"].name == f"{block}.experts_down.input_scale"
        assert isinstance(args["shd_sg"], WeightScalar) and args["shd_sg"].name == f"{block}.shared_down.weight_scale_2"
        assert args["limit"] == FloatLit(plan.blueprint.config.constants.swiglu_limit)
        assert args["prefetch_rows"] == IntLit(sym["hidden"] // 4)
        # nothing inside the merged group is materialized: every tap is the instance's scratch
        assert all(args[n] == NULL for n in M.PARAM_NAMES[M.PARAM_NAMES.index("logits"):])
        assert unwritten(plan, g, launches) == []


def test_fused_group_has_no_internal_buffers(tiny):
    plan, _ = tiny
    names = {b.name for b in plan.buffers}
    for g in family_groups(plan, "glm_moe_layer"):
        block = plan.blueprint.node_by_id[g.nodes[0]].block
        for internal in ("gate.logits", "top_k.topk_id", "experts_gate_up.egu", "experts_down.edown"):
            assert f"{block}.{internal}" not in names


def test_planner():
    seed = M.plan_moe_layer(M.MoeLayerShape(4096, 2048, 2048, 288, 8), 132)
    assert seed.kernel == "kbp::moe_layer<4096, 2048, 2048, 288, 8, 1, 1, 4, 1, 3>"
    assert (seed.gate_up.grid, seed.down.grid) == (264, 264)        # 2 CTAs per SM
    # few tiles: the K split grows (at most one part per 128-wide chunk)
    small = M.plan_moe_layer(M.MoeLayerShape(1024, 256, 0, 16, 2), 132)
    assert (small.gate_up.parts, small.down.parts) == (8, 2)
    # staged down inputs of 32 slots do not fit two CTAs: one per SM, a deeper ring
    wide = M.plan_moe_layer(M.MoeLayerShape(4096, 2048, 0, 64, 32), 132)
    assert wide.down.grid == 132 and wide.down.smem + M.static_smem_bytes(wide.shape) <= M.SMEM_PER_SM
    for p in (seed.gate_up, seed.down, wide.down):
        assert p.smem == M.smem_bytes(p.stages, (p.smem - M.pipe_smem_bytes(p.stages) - p.stages * M.STAGE_BYTES)
                                      // M.ACT_BYTES)


@pytest.mark.parametrize("shape,what", [
    (M.MoeLayerShape(4000, 2048, 0, 8, 2), "multiples of 128"),
    (M.MoeLayerShape(4096, 2048, 40, 8, 2), "multiple of 16"),
    (M.MoeLayerShape(4096, 2048, 0, 8, 33), "top_k"),
    (M.MoeLayerShape(4096, 2048, 0, 2000, 8), "experts <= 1024"),
    (M.MoeLayerShape(4096, 8192, 0, 64, 32), "no room"),
])
def test_planner_refuses(shape, what):
    with pytest.raises(LoweringError, match=what):
        M.plan_moe_layer(shape, 132)


def test_lowering_refuses_other_renorm_eps(tiny):
    plan, ctx = tiny
    g = family_groups(plan, "glm_moe_layer")[0]
    bad = dataclasses.replace(plan.blueprint.config.constants, router_renorm_eps=1e-6)
    ctx.c = bad
    try:
        with pytest.raises(LoweringError, match="router_renorm_eps"):
            M.lower(ctx, g)
    finally:
        ctx.c = plan.blueprint.config.constants
