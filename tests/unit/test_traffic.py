"""The per-group byte floor the benchmark measures kernels against."""
from __future__ import annotations

import json

import pytest

from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.ir.weights import weight_specs
from kbpc.passes import run_pipeline
from kbpc.runtime.traffic import family_bytes, group_bytes


@pytest.fixture(scope="module")
def tiny(tiny_path):
    bp = load_blueprint(tiny_path)
    plan = json.loads(json.dumps(run_pipeline(bp, Options(max_context=4096)).to_json()))
    return bp, plan


def test_recurrence_moves_its_state_twice(tiny):
    bp, plan = tiny
    s = bp.symbols
    state = s["lin_v_heads"] * s["lin_k_dim"] * s["lin_v_dim"] * 4
    # the recurrence's group: kda_recurrent, or kda_fused once the fusion pass merged the KDA chain
    g = next(g for g in plan["groups"] if any(bp.node_by_id[n].op == "gdn_recurrence" for n in g["nodes"]))
    assert group_bytes(bp, plan, 100)[g["id"]] > 2 * state


def test_weights_are_counted_once_and_caches_grow_with_context(tiny):
    bp, plan = tiny
    weights = sum(w.bytes_per_token for w in weight_specs(bp))
    short, long = family_bytes(bp, plan, 16), family_bytes(bp, plan, 4000)
    assert sum(short.values()) > weights
    assert long["dsa_indexer"] > short["dsa_indexer"] and long["glm_mla_decode"] > short["glm_mla_decode"]
    assert long["w4a16_gemv"] == short["w4a16_gemv"]


def test_fp8_index_cache_reads_a_quarter_of_the_pool_keys(tiny_path):
    bp = load_blueprint(tiny_path)
    s = bp.symbols
    ctx, pools = 4000, 4001 // s["index_kpool"]
    indexer = {}
    for kind in ("f32", "fp8"):
        plan = json.loads(json.dumps(run_pipeline(bp, Options(max_context=4096, index_cache=kind)).to_json()))
        indexer[kind] = family_bytes(bp, plan, ctx)["dsa_indexer"]
    layers = sum(1 for n in bp.nodes() if n.op == "index_select")
    assert indexer["f32"] - indexer["fp8"] == layers * pools * (s["index_head_dim"] * 3 - 4)
