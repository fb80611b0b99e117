"""Lowering of dense_bf16 groups: the 256-thread GEMV for large N, fewer outputs per CTA (the same
bits on more SMs) for small N, on the seed's shapes and the tiny example."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import lit
from kbpc.codegen.families import dense_bf16
from kbpc.testing.lowering import family_groups, planned, unwritten


@pytest.mark.parametrize("n,opc", [(154880, 4), (4096, 4), (1053, 4), (1052, 2), (527, 2), (526, 1), (128, 1), (1, 1)])
def test_outputs_per_cta(n, opc):
    assert dense_bf16.outputs_per_cta(n) == opc
    assert -(-n // opc) >= dense_bf16.MIN_CTAS or opc == 1


@pytest.mark.parametrize("which", ["tiny", "seed"])
def test_lowering(which, tiny_path, seed_path):
    plan, ctx = planned(str(tiny_path if which == "tiny" else seed_path))
    groups = family_groups(plan, "dense_bf16")
    assert groups
    for g in groups:
        launches = dense_bf16.lower(ctx, g)
        assert unwritten(plan, g, launches) == []
        for launch, node_id in zip(launches, g.nodes):
            node = plan.blueprint.node_by_id[node_id]
            k, n = ctx.input(node).dim_value, ctx.output(node).dim_value
            opc = dense_bf16.outputs_per_cta(n)
            assert launch.block == (64 * opc, 1, 1) and launch.grid == (-(-n // opc), 1, 1)
            assert launch.args[-1] == lit(n)
            name = "dense_gemv_bf16<" if opc == 4 else "dense_gemv_bf16_opc<"
            assert launch.instance.kernel.startswith("kbp::" + name + f"{k}, ")
