"""Lowering of the embed_row_copy group on the tiny blueprint."""
from __future__ import annotations

import dataclasses

import pytest

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import embed_copy
from kbpc.ir.state import StateBuffer
from kbpc.testing.lowering import family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_embed_launch(tiny):
    plan, ctx = tiny
    (g,) = family_groups(plan, "embed_copy")
    assert g.rule == "embed_row_copy"
    (launch,) = embed_copy.lower(ctx, g)
    node = ctx.node(g, "embed")
    d, vocab = ctx.output(node).dim_value, plan.blueprint.symbols["vocab"]
    assert launch.instance.kernel == f"kbp::embed_copy<{d}, 8>"
    assert (launch.grid, launch.block, launch.smem) == ((-(-d // 512), 1, 1), (64, 1, 1), 0)
    assert launch.args == (StepInput("TOKEN"), ctx.weight(node, ctype="uint16_t"), lit(vocab),
                           ctx.buf(ctx.output(node), "uint16_t"), NULL)
    assert unwritten(plan, g, [launch]) == []


def test_embed_error_flag_state(tiny):
    plan, _ = tiny
    (g,) = family_groups(plan, "embed_copy")
    flagged = dataclasses.replace(plan, state=plan.state + (StateBuffer("embed.embed.error_flag", 4, (1,), "i32"),))
    ctx = LowerCtx(flagged)
    (launch,) = embed_copy.lower(ctx, g)
    assert launch.args[-1] == ctx.state("embed.embed.error_flag", "int")
