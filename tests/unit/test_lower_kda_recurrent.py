"""Lowering of kda_recurrent groups (glm_kda_recurrence_row_reg) on the tiny blueprint."""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import kda_recurrent as rec
from kbpc.reference.kda_recurrent import query_scale
from kbpc.testing.lowering import arena_ref, family_groups, planned, unwritten

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
        row = arena_ref(plan, f"{layer}.l2.qkvn")
        assert row in q and row in k and row in v
        assert k.endswith(f" + {hk * dk})") and v.endswith(f" + {2 * hk * dk})")
        assert qs == str(2 * hk * dk + hv * dv)
        assert arena_ref(plan, f"{layer}.gates.decay") in decay and ds == str(hv * dk)
        assert arena_ref(plan, f"{layer}.gates.beta") in beta and bs == str(hv)
        assert np.float32(float(scale.removesuffix("f"))) == query_scale(dk)
        assert st == f"((float*)S[{state.index(node_id + '.state')}])" and ss == str(hv * dk * dv)
        assert snap == "nullptr"
        assert arena_ref(plan, f"{node_id}.core") in out and out.startswith("((float*)") and os_ == str(hv * dv)
        assert unwritten(plan, g, [launch]) == []
