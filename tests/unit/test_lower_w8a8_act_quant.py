"""Lowering of w8a8_act_quant groups (per-token FP8 quantization) on the tiny blueprint."""
from __future__ import annotations

import pytest

from kbpc.codegen.families import w8a8_act_quant
from kbpc.targets import get_target
from kbpc.testing.lowering import family_groups, planned, unwritten


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "w8a8_act_quant")
    assert {g.rule for g in groups} == {"w8a8_act_quant_row"}
    for g in groups:
        (launch,) = w8a8_act_quant.lower(ctx, g)
        node = plan.blueprint.node_by_id[g.nodes[0]]
        x, q = ctx.input(node), ctx.output(node)
        out = ctx.quant(q)
        k, cl = x.dim_value, w8a8_act_quant.row_cluster(x.dim_value, get_target(plan.options.target).max_cluster)
        split = w8a8_act_quant.row_split(k)
        if cl:   # one cluster a row where the target has clusters and the row needs more than one CTA
            assert launch.instance.kernel == f"kbp::w8a8_act_quant_row_cluster<{k}, {cl}>"
            assert launch.instance.cluster == cl and launch.grid == (cl, ctx.rows(x), 1)
        else:
            targs = f"{k}" if split == 1 else f"{k}, {split}"
            assert launch.instance.kernel == f"kbp::w8a8_act_quant_row<{targs}>"
            assert launch.instance.cluster == 0 and launch.grid == (ctx.rows(x), split, 1)
        assert launch.instance.params == ("const __nv_bfloat16*", "uint8_t*", "float*")
        assert launch.block == (256, 1, 1) and launch.smem == 0
        assert launch.args == (ctx.buf(x), out.codes, out.scales)
        assert unwritten(plan, g, [launch]) == []


@pytest.mark.parametrize("k, split", [(8, 1), (1536, 1), (2048, 1), (4096, 2), (12288, 6), (16384, 8),
                                      (18432, 9), (65536, 32)])
def test_row_split_gives_each_thread_one_vector_at_most(k, split):
    """One CTA per 256-vector slice of the row: a thread encodes one 8-value vector."""
    assert w8a8_act_quant.row_split(k) == split == -(-(k // 8) // 256)


@pytest.mark.parametrize("k, max_cluster, cl", [(8, 16, 0), (1024, 16, 0), (1028, 16, 2), (4096, 16, 4),
                                                (4096, 8, 4), (16384, 16, 16), (16384, 8, 8), (65536, 16, 16),
                                                (4096, 1, 0)])
def test_row_cluster_gives_each_thread_one_run_where_it_can(k, max_cluster, cl):
    """One run of four values a thread while the target's widest cluster allows (more runs a thread
    past it); no cluster where one CTA covers the row or the target has none."""
    assert w8a8_act_quant.row_cluster(k, max_cluster) == cl
