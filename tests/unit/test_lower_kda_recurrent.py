"""Lowering of kda_recurrent groups (glm_kda_recurrence_row_reg) on the tiny blueprint."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.args import NULL, StatePtr, lit
from kbpc.codegen.families import kda_recurrent as rec
from kbpc.reference.kda_recurrent import query_scale
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_scale_is_the_references_float():
    assert np.float32(rec.query_scale(128)) == query_scale(128)
    assert rec.query_scale(128) == float(np.float32(1) / np.sqrt(np.float32(128)))


def test_recurrence_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "kda_recurrent")
    assert groups and {g.rule for g in groups} == {"glm_kda_recurrence_row_reg"}
    sym = plan.blueprint.symbols
    hk, hv, dk, dv = sym["lin_k_heads"], sym["lin_v_heads"], sym["lin_k_dim"], sym["lin_v_dim"]
    state = [s.name for s in plan.state]
    for g in groups:
        (launch,) = rec.lower(ctx, g)
        (node_id,) = g.nodes
        layer = node_id.rsplit(".", 1)[0]
        assert launch.instance.kernel == f"kbp::kda_recurrent_decode_bf16_seq_reg<{hk}, {hv}, {dk}, {dv}, 32, 1>"
        assert launch.grid == (hv, dv // 32, 1) and launch.block == (32, 1, 1) and launch.smem == 0
        q, k, v, qs, decay, ds, beta, bs, scale, st, ss, snap, out, os_ = launch.args
        assert points_into(q, f"{layer}.l2.qkvn") and q.ctype == BF
        assert k == q.plus(hk * dk) and v == q.plus(2 * hk * dk)
        assert qs == lit(2 * hk * dk + hv * dv)
        assert points_into(decay, f"{layer}.gates.decay") and ds == lit(hv * dk)
        assert points_into(beta, f"{layer}.gates.beta") and bs == lit(hv)
        assert np.float32(scale.value) == query_scale(dk)
        assert st == StatePtr(state.index(node_id + '.state'), node_id + '.state', "float") and ss == lit(hv * dk * dv)
        assert snap == NULL
        assert points_into(out, f"{node_id}.core") and out.ctype == "float" and os_ == lit(hv * dv)
        assert unwritten(plan, g, [launch]) == []
