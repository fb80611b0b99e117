"""Lowering of dsa_indexer groups (glm_index_store, its fused form with the key's LayerNorm
(rule dsa_key_store), glm_index_select_persisted) on the tiny blueprint with both index caches,
the template sizes on the seed, and the size checks."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families import dsa_indexer
from kbpc.frontend.load import load_blueprint
from kbpc.ir.buffers import buffer_name
from kbpc.ir.plan import Options
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.passes import run_pipeline
from kbpc.targets import get_target
from kbpc.toolchain.assets import KERNELS_DIR


def _plan(path, **options):
    plan = run_pipeline(load_blueprint(path), Options(target="sm_90", **options))
    return plan, LowerCtx(plan)


@pytest.fixture(scope="module", params=["f32", "fp8"])
def tiny(tiny_path, request):
    """The plan without rule dsa_key_store: the store as its own launch (the fused form: `tiny_fused`)."""
    return _plan(tiny_path, index_cache=request.param, skip_fusions=("dsa_key_store",))


@pytest.fixture(scope="module", params=["f32", "fp8"])
def tiny_fused(tiny_path, request):
    return _plan(tiny_path, index_cache=request.param)


def groups(plan, rule):
    found = [g for g in plan.groups if g.family == "dsa_indexer" and g.rule == rule]
    assert found, rule
    return found


def _pool_state(plan, ctx, node_id):
    if plan.options.index_cache == "fp8":
        return NULL, ctx.state(f"{node_id}.pool_codes", "uint8_t"), ctx.state(f"{node_id}.pool_scales", "float")
    return ctx.state(f"{node_id}.pool_keys", "float"), NULL, NULL


def test_every_rule_is_covered(tiny, tiny_fused):
    plan, _ = tiny
    assert {g.rule for g in plan.groups if g.family == "dsa_indexer"} == {
        "glm_index_store", "glm_index_select_persisted"}
    plan, _ = tiny_fused
    assert {g.rule for g in plan.groups if g.family == "dsa_indexer"} == {
        "fused:dsa_key_store", "glm_index_select_persisted"}


def _store_tail(plan, ctx, node, tail):
    """The arguments after the key (both store forms): gate, slot term, tail state, rows, the pool
    state of the index cache, POS."""
    gate, a, keys, gates, rows, *pools, tau = tail
    kp = plan.blueprint.symbols["index_kpool"]
    assert gate == ctx.buf(ctx.input(node, op="linear"))
    assert a == ctx.weight(node, "slot_bias", ctype="float")
    assert keys == ctx.state(f"{node.id}.tail_keys", "__nv_bfloat16")
    assert gates == ctx.state(f"{node.id}.tail_gates", "__nv_bfloat16")
    assert rows == lit(kp) and tau == StepInput("POS")
    assert tuple(pools) == _pool_state(plan, ctx, node.id)


def _store_launches(plan, ctx, rule: str, kernel: str):
    """(launch, group) of each store group, its kernel and geometry checked."""
    sym = plan.blueprint.symbols
    d, kp = sym["index_head_dim"], sym["index_kpool"]
    fp8 = "true" if plan.options.index_cache == "fp8" else "false"
    for g in groups(plan, rule):
        (launch,) = dsa_indexer.lower(ctx, g)
        assert launch.instance.kernel == f"kbp::{kernel}<{d}, {kp}, {fp8}>"
        assert (launch.grid, launch.block) == ((1, 1, 1), (d, 1, 1))
        assert len(launch.args) == len(launch.instance.params)
        yield launch, g


def test_store(tiny):
    plan, ctx = tiny
    for launch, g in _store_launches(plan, ctx, "glm_index_store", "dsa_indexer_store"):
        node = ctx.node(g, "kpool_compress")
        key, *tail = launch.args
        assert len(launch.args) == 10 and key == ctx.buf(ctx.input(node, op="layer_norm"))
        _store_tail(plan, ctx, node, tail)


def test_store_with_the_key_norm(tiny_fused):
    """Rule dsa_key_store: one launch reads the norm's input and weights; the normalised key has no
    buffer (no group outside reads it); the store's other arguments are the plain store's."""
    plan, ctx = tiny_fused
    for launch, g in _store_launches(plan, ctx, "fused:dsa_key_store", "dsa_indexer_store_norm"):
        norm, node = ctx.node(g, "layer_norm"), ctx.node(g, "kpool_compress")
        assert launch.nodes == (norm.id, node.id) and len(launch.args) == 13
        x, w, b, eps, *tail = launch.args
        assert x == ctx.buf(ctx.input(norm))
        assert (w, b) == (ctx.weight(norm, ctype="__nv_bfloat16"), ctx.weight(norm, "bias", "__nv_bfloat16"))
        assert eps == flt(ctx.c.layer_norm_eps)
        _store_tail(plan, ctx, node, tail)
        key = ctx.input(node, op="layer_norm")
        assert buffer_name(plan.blueprint, key) not in {buf.name for buf in plan.buffers}


def test_select(tiny):
    plan, ctx = tiny
    sym = plan.blueprint.symbols
    h, d, kp = sym["index_heads"], sym["index_head_dim"], sym["index_kpool"]
    topk = sym["index_topk"] // kp
    fp8 = "true" if plan.options.index_cache == "fp8" else "false"
    assert plan.options.numerics == "fast"
    qrot = fp8   # fast numerics: the fp8 cache is scored against the rotated query
    mma = "false" if fp8 == "true" else "true"   # ... and the f32 cache on tensor cores
    order_free = "true"   # ... and the fast decode takes the selection as a set
    for g in groups(plan, "glm_index_select_persisted"):
        (launch,) = dsa_indexer.lower(ctx, g)
        node = ctx.node(g, "index_select")
        pool = next(n for n in plan.blueprint.nodes() if n.op == "kpool_compress" and n.block == node.block)
        scores, hist, arrive, cand = dsa_indexer.scratch_names(node.id)
        assert launch.instance.kernel == \
            f"kbp::dsa_index_select<{h}, {d}, {kp}, {topk}, {fp8}, {INDEX_SELECT_BIN_BITS}, {qrot}, {mma}, {order_free}>"
        capacity = -(-plan.options.max_context // kp)
        assert launch.grid == (min(get_target("sm_90").sms, -(-capacity // 32)), 1, 1)
        assert launch.block == (512, 1, 1) and launch.smem == 0
        sel = ctx.output(node)
        assert launch.args == (ctx.buf(ctx.input(node, "iq"), "float"), ctx.buf(ctx.input(node, "iw"), "float"),
                               *_pool_state(plan, ctx, pool.id), StepInput("SEQ"), StepInput("POS"),
                               ctx.state(scores, "float"), ctx.state(hist, "uint32_t"),
                               ctx.state(arrive, "uint32_t"), ctx.state(cand, "unsigned long long"),
                               ctx.buf(sel, "int32_t"))
        assert buffer_name(plan.blueprint, sel) in {b.name for b in plan.buffers}


def test_state_sizes_follow_the_index_cache(tiny):
    plan, _ = tiny
    sym = plan.blueprint.symbols
    pools, d = -(-plan.options.max_context // sym["index_kpool"]), sym["index_head_dim"]
    state = {s.name: s for s in plan.state}
    for node in plan.blueprint.nodes():
        if node.op == "kpool_compress":
            if plan.options.index_cache == "fp8":
                assert state[f"{node.id}.pool_codes"].nbytes == pools * d
                assert state[f"{node.id}.pool_scales"].nbytes == pools * 4
                assert f"{node.id}.pool_keys" not in state
            else:
                assert state[f"{node.id}.pool_keys"].nbytes == pools * d * 4
        if node.op == "index_select":
            scores, hist, arrive, cand = dsa_indexer.scratch_names(node.id)
            assert state[scores].shape == (pools,) and state[arrive].shape == (2,)
            assert state[hist].shape == (1 << INDEX_SELECT_BIN_BITS,)
            assert state[cand].nbytes == 8 * INDEX_SELECT_FILTER_CAP


def test_candidate_list_size_is_the_kernels():
    """The candidate list state holds the kernel's DSA_FILTER_CAP rank keys."""
    text = (KERNELS_DIR / "dsa_index_select.cuh").read_text()
    assert f"constexpr int DSA_FILTER_CAP = {INDEX_SELECT_FILTER_CAP};" in text


def test_seed_sizes(seed_path):
    plan, ctx = _plan(seed_path, max_context=524288)
    kernels = {(l.instance.kernel, l.grid) for g in plan.groups if g.family == "dsa_indexer"
               for l in dsa_indexer.lower(ctx, g)}
    assert kernels == {("kbp::dsa_indexer_store_norm<128, 4, false>", (1, 1, 1)),
                       ("kbp::dsa_index_select<32, 128, 4, 512, false, 11, false, true, true>", (132, 1, 1))}


@pytest.mark.parametrize("numerics,index_cache,qrot,mma", [("fast", "fp8", True, False), ("exact", "fp8", False, False),
                                                           ("fast", "f32", False, True),
                                                           ("exact", "f32", False, False)])
def test_bounded_select_forms_only_in_fast_mode(tiny_path, numerics, index_cache, qrot, mma):
    """The select's bounded forms (not the reference's bits) need `fast` numerics: the fp8 cache
    is scored against the rotated query, the f32 cache on tensor cores, and a selection of every
    valid pool is listed unranked for the fast decode; exact keeps the reference's read-back, lane
    order and rank order."""
    plan, ctx = _plan(tiny_path, numerics=numerics, index_cache=index_cache)
    (g,) = groups(plan, "glm_index_select_persisted")[:1]
    (launch,) = dsa_indexer.lower(ctx, g)
    fp8 = index_cache == "fp8"
    order_free = numerics == "fast"
    assert launch.instance == dsa_indexer.select_instance(*_select_sizes(plan), fp8, qrot=qrot, mma=mma,
                                                          order_free=order_free)
    flag = {True: "true", False: "false"}
    assert launch.instance.kernel.endswith(f", {flag[qrot]}, {flag[mma]}, {flag[order_free]}>")


def _select_sizes(plan) -> tuple[int, int, int, int]:
    sym = plan.blueprint.symbols
    return sym["index_heads"], sym["index_head_dim"], sym["index_kpool"], sym["index_topk"] // sym["index_kpool"]


def test_rotated_query_needs_the_fp8_cache():
    with pytest.raises(ValueError):
        dsa_indexer.select_instance(32, 128, 4, 512, False, qrot=True)


def test_tensor_core_scores_need_the_f32_cache():
    with pytest.raises(ValueError):
        dsa_indexer.select_instance(32, 128, 4, 512, True, mma=True)


def test_select_forms_over_the_shared_memory_limit_are_lowering_errors():
    """128 index heads of width 128: the CUDA-core forms' staging (32 pools' keys and 129 head terms
    a pool) is over 48 KB, the tensor-core form's query fragments are not; 61 heads is the first
    f32 CUDA-core size over."""
    for fp8 in (False, True):
        with pytest.raises(LoweringError, match="shared memory"):
            dsa_indexer.check_select_sizes(128, 128, 512, fp8)
    dsa_indexer.check_select_sizes(128, 128, 512, False, mma=True)
    dsa_indexer.check_select_sizes(60, 128, 512, False)
    with pytest.raises(LoweringError, match="shared memory"):
        dsa_indexer.check_select_sizes(61, 128, 512, False)


def test_size_limits_are_lowering_errors():
    dsa_indexer.check_select_sizes(32, 128, 512, True)
    dsa_indexer.check_select_sizes(128, 64, 1, False)
    for heads, d, topk, fp8 in ((129, 128, 512, False), (32, 160, 512, False), (32, 48, 512, False),
                                (32, 96, 512, True), (32, 128, 513, False), (0, 128, 16, False)):
        with pytest.raises(LoweringError):
            dsa_indexer.check_select_sizes(heads, d, topk, fp8)
