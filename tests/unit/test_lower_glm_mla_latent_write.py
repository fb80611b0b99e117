"""Lowering of glm_mla_latent_write groups (kv_norm + kv_write) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import FloatLit, StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import glm_mla_latent_write
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.ir.buffers import buffer_name


@pytest.fixture(scope="module")
def tiny(tiny_path):
    plan = run_pipeline(load_blueprint(tiny_path), Options(target="sm_90"))
    return plan, LowerCtx(plan)


def groups(plan, family):
    found = [g for g in plan.groups if g.family == family]
    assert found, f"no {family} groups"
    return found


def test_latent_write_launch(tiny):
    plan, ctx = tiny
    for g in groups(plan, "glm_mla_latent_write"):
        assert g.rule == "glm_mla_latent_write"
        (launch,) = glm_mla_latent_write.lower(ctx, g)
        norm, write = ctx.node(g, "rms_norm"), ctx.node(g, "kv_write")
        e = ctx.input(norm).dim_value
        assert launch.instance.kernel == f"kbp::glm_mla_latent_write_fp8_paged<{e}>"
        assert launch.instance.header == "glm_mla_latent_write.cuh"
        assert (launch.grid, launch.block, launch.smem) == ((1, 1, 1), (e, 1, 1), 0)
        assert len(launch.args) == len(launch.instance.params) == 8
        c, gamma, table, page, pos, s_k, eps, cache = launch.args
        assert c == ctx.buf(ctx.input(norm))
        assert gamma == ctx.weight(norm, ctype="__nv_bfloat16")
        assert table == ctx.state(f"{write.id}.block_table", "int32_t")
        assert page == lit(ctx.c.latent_page_tokens) and pos == StepInput("POS")
        assert s_k == ctx.weight_value(write, "k_scale") and eps == FloatLit(1e-05)
        assert cache == ctx.state(f"{write.id}.latent_cache", "uint8_t")
        assert launch.nodes == (norm.id, write.id)
        # The normalised row is fused: no buffer; kv_write has no output edge.
        names = {b.name for b in plan.buffers}
        assert buffer_name(plan.blueprint, ctx.output(norm)) not in names
