"""Lowering of glm_mla_attend groups (sparse MLA decode, split over the attended tokens) on the
tiny blueprint and the seed."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import glm_mla_decode
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.reference.glm_mla_decode import ORDER_GROUP, ORDER_WARPS


def _plan(path, **options):
    plan = run_pipeline(load_blueprint(path), Options(target="sm_90", **options))
    return plan, LowerCtx(plan)


@pytest.fixture(scope="module", params=["exact", "fast"])
def tiny(tiny_path, request):
    return _plan(tiny_path, numerics=request.param)


def test_heads_per_cta():
    assert [glm_mla_decode.heads_per_cta(h) for h in (32, 2, 1, 6, 12, 7)] == [4, 2, 1, 2, 4, 1]


def test_decode_launch(tiny):
    plan, ctx = tiny
    sym = plan.blueprint.symbols
    found = [g for g in plan.groups if g.family == "glm_mla_decode"]
    assert found
    for g in found:
        assert g.rule == "glm_mla_attend"
        (launch,) = glm_mla_decode.lower(ctx, g)
        node = ctx.node(g, "mla_attention")
        e, heads = sym["kv_lora"], sym["q_heads"]
        hpc = glm_mla_decode.heads_per_cta(heads)
        assert launch.instance.kernel == f"kbp::glm_mla_decode_split<{e}, {ORDER_WARPS}, {ORDER_GROUP}, {hpc}>"
        assert launch.grid == (ORDER_WARPS, heads // hpc, 1) and launch.block == (256, 1, 1) and launch.smem == 0
        assert len(launch.args) == len(launch.instance.params) == 11
        q, cache, table, page, sel, width, seq, s_k, out, merge, counters = launch.args
        assert q == ctx.buf(ctx.input(node, op="linear"))
        assert sel == ctx.buf(ctx.input(node, op="index_select"), "int32_t")
        assert width == lit((sym["index_topk"] // sym["index_kpool"] + 1) * sym["index_kpool"])
        writer = next(n for n in plan.blueprint.nodes() if n.op == "kv_write" and n.block == node.block)
        assert cache == ctx.state(f"{writer.id}.latent_cache", "uint8_t")
        assert table == ctx.state(f"{writer.id}.block_table", "int32_t")
        assert page == lit(ctx.c.latent_page_tokens) and seq == StepInput("SEQ")
        assert s_k == ctx.weight_value(writer, "k_scale")
        assert out == ctx.buf(ctx.output(node))   # the group's only non-fused output
        assert merge == ctx.state(f"{node.id}.merge", "float")
        assert counters == ctx.state(f"{node.id}.counters", "uint32_t")
        state = {s.name: s for s in plan.state}
        assert state[f"{node.id}.merge"].nbytes == 2 * ORDER_WARPS * heads * (e + 2) * 4
        assert state[f"{node.id}.counters"].nbytes == ORDER_WARPS * heads * 4


def test_seed_fills_the_gpu(seed_path):
    plan, ctx = _plan(seed_path)
    launches = [l for g in plan.groups if g.family == "glm_mla_decode" for l in glm_mla_decode.lower(ctx, g)]
    assert launches and all(l.instance.kernel == "kbp::glm_mla_decode_split<512, 16, 4, 4>" and
                            l.grid == (16, 8, 1) for l in launches)
