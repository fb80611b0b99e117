"""Lowering of dense_bf16 groups: the 256-thread GEMV for large N, fewer outputs per CTA (the same
bits on more SMs) for small N, on the seed's shapes and the tiny example; and the score-only form:
in numerics `fast` the projections whose only reader is an unranked select (the DSA index queries
and head weights) lower to dense_gemv_bf16_scores_only with the select's pool size and top k and the
step's SEQ and POS, so they idle while the select lists every pool; every other dense projection (the
router, the LM head, the index gate that feeds the pool keys) and every one in `exact` numerics
(whose select ranks) keeps the plain kernel."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import StepInput, lit
from kbpc.codegen.families import dense_bf16
from kbpc.ir.ops import unranked_scores_reader
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
            assert launch.args[3] == lit(n)
            if "scores_only" in launch.instance.kernel:   # test_only_the_unranked_selects_score_inputs_idle
                assert launch.instance.kernel.startswith(f"kbp::dense_gemv_bf16_scores_only<{k}, ")
                continue
            assert len(launch.args) == 4
            name = "dense_gemv_bf16<" if opc == 4 else "dense_gemv_bf16_opc<"
            assert launch.instance.kernel.startswith("kbp::" + name + f"{k}, ")


def _dense_launches(path, numerics):
    plan, ctx = planned(str(path), numerics=numerics)
    return plan, [(launch, ctx.bp.node_by_id[launch.nodes[0]]) for g in family_groups(plan, "dense_bf16")
                  for launch in dense_bf16.lower(ctx, g)]


@pytest.mark.parametrize("numerics", ["fast", "exact"])
def test_only_the_unranked_selects_score_inputs_idle(tiny_path, seed_path, numerics):
    for path in (tiny_path, seed_path):
        plan, launches = _dense_launches(path, numerics)
        sym = plan.blueprint.symbols
        idle = [(launch, node) for launch, node in launches if "scores_only" in launch.instance.kernel]
        roles = sorted({node.op for _, node in idle})
        if numerics == "exact":
            assert not idle
            continue
        assert roles == ["linear:index_q", "linear:index_weights"]
        assert len(idle) == 2 * sum(1 for n in plan.blueprint.nodes() if n.op == "index_select")
        for launch, node in idle:
            assert unranked_scores_reader(plan.blueprint, node, numerics).op == "index_select"
            assert launch.instance.kernel.endswith(f", {sym['index_kpool']}, {sym['index_topk'] // sym['index_kpool']}>")
            assert launch.args[-2:] == (StepInput("SEQ"), StepInput("POS"))
            assert len(launch.args) == len(launch.instance.params)
        plain = {node.op for launch, node in launches if "scores_only" not in launch.instance.kernel}
        assert "linear:index_gate" in plain


def test_score_only_instance_is_the_plain_kernel_with_the_select_geometry():
    inst = dense_bf16.scores_only_instance(1536, "float", 4, 4, 512)
    plain = dense_bf16.instance(1536, "float", 4)
    assert inst.kernel == "kbp::dense_gemv_bf16_scores_only<1536, float, 4, 4, 512>"
    assert inst.params == plain.params + ("const int32_t*", "const int32_t*")
