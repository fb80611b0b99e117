"""Lowering of glm_mla_attend groups (sparse MLA decode) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import glm_mla_decode
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline


@pytest.fixture(scope="module")
def tiny(tiny_path):
    plan = run_pipeline(load_blueprint(tiny_path), Options(target="sm_90"))
    return plan, LowerCtx(plan)


def test_decode_launch(tiny):
    plan, ctx = tiny
    sym = plan.blueprint.symbols
    found = [g for g in plan.groups if g.family == "glm_mla_decode"]
    assert found
    for g in found:
        assert g.rule == "glm_mla_attend"
        (launch,) = glm_mla_decode.lower(ctx, g)
        node = ctx.node(g, "mla_attention")
        e = sym["kv_lora"]
        assert launch.instance.kernel == f"kbp::glm_mla_decode_fp8<{e}, 16, 4>"
        assert launch.grid == (sym["q_heads"], 1, 1) and launch.block == (512, 1, 1) and launch.smem == 0
        assert len(launch.args) == len(launch.instance.params) == 9
        q, cache, table, page, sel, width, seq, s_k, out = launch.args
        assert q == ctx.buf(ctx.input(node, op="linear"))
        assert sel == ctx.buf(ctx.input(node, op="index_select"), "int32_t")
        assert width == lit((sym["index_topk"] // sym["index_kpool"] + 1) * sym["index_kpool"])
        writer = next(n for n in plan.blueprint.nodes() if n.op == "kv_write" and n.block == node.block)
        assert cache == ctx.state(f"{writer.id}.latent_cache", "uint8_t")
        assert table == ctx.state(f"{writer.id}.block_table", "int32_t")
        assert page == lit(ctx.c.latent_page_tokens) and seq == StepInput("SEQ")
        assert s_k == ctx.weight_value(writer, "k_scale")
        assert out == ctx.buf(ctx.output(node))   # the group's only non-fused output
