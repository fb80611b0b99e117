"""Lowering of glm_mla_attend groups (sparse MLA decode, split over the attended tokens) on the
tiny blueprint and the seed, in both numerics modes: `exact` launches the merge-tree split with its
merge state, `fast` the sliced form with its partials (and neither allocates the other's); with
the output quantizer fused in (rule mla_attend_quant, fast only) the quantizing entry, its codes,
scales and sync words, and no BF16 output buffer."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx
from kbpc.codegen.families import glm_mla_decode
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.reference.glm_mla_decode import ORDER_GROUP, ORDER_WARPS
from kbpc.reference.glm_mla_decode_fast import MIN_SLICE, STAGE_BYTES, FastSplit, fast_split
from kbpc.targets import get_target


def _plan(path, **options):
    plan = run_pipeline(load_blueprint(path), Options(target="sm_90", **options))
    return plan, LowerCtx(plan)


def test_heads_per_cta():
    assert [glm_mla_decode.heads_per_cta(h) for h in (32, 2, 1, 6, 12, 7)] == [4, 2, 1, 2, 4, 1]


def _common_args(ctx, plan, node, args):
    """The arguments both forms share: q, cache, block table, page size, selection, width, seq_len, s_k."""
    sym = plan.blueprint.symbols
    q, cache, table, page, sel, width, seq, s_k = args
    assert q == ctx.buf(ctx.input(node, op="linear"))
    assert sel == ctx.buf(ctx.input(node, op="index_select"), "int32_t")
    assert width == lit((sym["index_topk"] // sym["index_kpool"] + 1) * sym["index_kpool"])
    writer = next(n for n in plan.blueprint.nodes() if n.op == "kv_write" and n.block == node.block)
    assert cache == ctx.state(f"{writer.id}.latent_cache", "uint8_t")
    assert table == ctx.state(f"{writer.id}.block_table", "int32_t")
    assert page == lit(ctx.c.latent_page_tokens) and seq == StepInput("SEQ")
    assert s_k == ctx.weight_value(writer, "k_scale")


def _attend_launches(path, numerics, rule="glm_mla_attend"):
    """plan, ctx, the latent width, heads, and (launch, attend node) of every glm_mla_attend group
    (`rule`: the groups' rule, fused:mla_attend_quant for the quantizing form)."""
    add = ("mla_attend_quant",) if rule == "fused:mla_attend_quant" else ()
    plan, ctx = _plan(path, numerics=numerics, add_fusions=add)
    found = [g for g in plan.groups if g.family == "glm_mla_decode"]
    assert found and all(g.rule == rule for g in found)
    pairs = [(l, ctx.node(g, "mla_attention")) for g in found for l in glm_mla_decode.lower(ctx, g)]
    assert len(pairs) == len(found)
    sym = plan.blueprint.symbols
    return plan, ctx, sym["kv_lora"], sym["q_heads"], pairs


def test_decode_launch_exact(tiny_path):
    plan, ctx, e, heads, pairs = _attend_launches(tiny_path, "exact")
    for launch, node in pairs:
        hpc = glm_mla_decode.heads_per_cta(heads)
        assert launch.instance.kernel == f"kbp::glm_mla_decode_split<{e}, {ORDER_WARPS}, {ORDER_GROUP}, {hpc}>"
        assert launch.instance.header == "glm_mla_decode.cuh"
        assert launch.grid == (ORDER_WARPS, heads // hpc, 1) and launch.block == (256, 1, 1) and launch.smem == 0
        assert len(launch.args) == len(launch.instance.params) == 11
        _common_args(ctx, plan, node, launch.args[:8])
        out, merge, counters = launch.args[8:]
        assert out == ctx.buf(ctx.output(node))   # the group's only non-fused output
        assert merge == ctx.state(f"{node.id}.merge", "float")
        assert counters == ctx.state(f"{node.id}.counters", "uint32_t")
        state = {s.name: s for s in plan.state}
        assert state[f"{node.id}.merge"].nbytes == ORDER_WARPS * heads * (e + 2) * 4
        assert state[f"{node.id}.counters"].nbytes == ORDER_WARPS * heads * 4
        assert f"{node.id}.partials" not in state


def test_decode_launch_fast(tiny_path):
    plan, ctx, e, heads, pairs = _attend_launches(tiny_path, "fast")
    sym = plan.blueprint.symbols
    for launch, node in pairs:
        width = (sym["index_topk"] // sym["index_kpool"] + 1) * sym["index_kpool"]
        split = fast_split(heads, width, 1, get_target("sm_90").sms, e)
        assert split.hpc == glm_mla_decode.heads_per_cta(heads)
        assert launch.instance.kernel == f"kbp::glm_mla_decode_fast<{e}, {split.hpc}>"
        assert launch.instance.header == "glm_mla_decode_fast.cuh"
        assert launch.grid == (split.slices, heads // split.hpc, 1) and launch.block == (256, 1, 1)
        # staged rows, z/p per row and head, row ids; the merge's factors and products per head and
        # slice; the CTA's share of merged outputs as BF16 (a multiple of 8)
        share = -(-(-(-split.hpc * e // split.slices)) // 8) * 8
        assert launch.smem == split.chunk * (e + 4 * split.hpc + 4) + 8 * split.hpc * split.slices + 2 * share
        assert len(launch.args) == len(launch.instance.params) == 12
        _common_args(ctx, plan, node, launch.args[:8])
        chunk, out, partials, counters = launch.args[8:]
        assert chunk == lit(split.chunk) and out == ctx.buf(ctx.output(node))
        assert partials == ctx.state(f"{node.id}.partials", "float")
        assert counters == ctx.state(f"{node.id}.counters", "uint32_t")
        state = {s.name: s for s in plan.state}
        assert state[f"{node.id}.partials"].shape == (1, split.slices, heads, e + 4)
        assert state[f"{node.id}.partials"].nbytes == split.slices * heads * (e + 4) * 4
        assert state[f"{node.id}.counters"].shape == (1, heads // split.hpc, 2)   # arrive, depart
        assert state[f"{node.id}.quant_sync"].shape == (1, split.slices * heads // split.hpc + 2)
        assert f"{node.id}.merge" not in state


def test_decode_launch_fast_quant(tiny_path):
    plan, ctx, e, heads, pairs = _attend_launches(tiny_path, "fast", rule="fused:mla_attend_quant")
    for launch, node in pairs:
        split = fast_split(heads, launch.args[5].value, 1, get_target("sm_90").sms, e)
        assert launch.instance.kernel == f"kbp::glm_mla_decode_fast_quant<{e}, {split.hpc}>"
        assert len(launch.args) == len(launch.instance.params) == 15
        _common_args(ctx, plan, node, launch.args[:8])
        out, codes, scales, sync = launch.args[9], *launch.args[12:]
        assert out == NULL   # the quantizer, fused in, was the BF16 output's only reader
        quant = next(n for n in plan.blueprint.nodes() if n.op == "act_quant"
                     and any(t.src == node.order for t in plan.blueprint.inputs(n.order)))
        assert set(launch.nodes) == {node.id, quant.id}
        q = ctx.quant(ctx.output(quant))
        assert (codes, scales) == (q.codes, q.scales)
        assert sync == ctx.state(f"{node.id}.quant_sync", "uint32_t")
        state = {s.name: s for s in plan.state}
        assert state[f"{node.id}.quant_sync"].shape == (1, heads // split.hpc + 2)


def test_fast_split_geometry():
    """One wave on the target (slices x head groups x rows <= SMs), no slice below MIN_SLICE entries,
    a chunk that holds a slice's entries when they fit one thread each and STAGE_BYTES."""
    for heads, width, rows, sms, e in [(32, 2052, 1, 132, 512), (16, 2052, 1, 132, 512), (2, 20, 1, 132, 512),
                                       (32, 2052, 2, 148, 512), (4, 5000, 1, 48, 1024), (64, 2052, 3, 132, 512)]:
        s = fast_split(heads, width, rows, sms, e)
        groups = heads // s.hpc
        assert s.slices * groups * rows <= max(sms, groups * rows)
        assert s.slices == 1 or -(-width // s.slices) >= MIN_SLICE
        entries = -(-width // s.slices)
        assert s.chunk == min(entries, 256, STAGE_BYTES // e)
    assert fast_split(32, 2052, 1, 132, 512) == FastSplit(4, 16, 129)


@pytest.mark.parametrize("numerics,kernel,grid,smem", [
    ("exact", "kbp::glm_mla_decode_split<512, 16, 4, 4>", (16, 8, 1), 0),
    ("fast", "kbp::glm_mla_decode_fast<512, 4>", (16, 8, 1), 129 * (512 + 20) + 3 * 4 * 4 * 16)])
def test_seed_fills_the_gpu(seed_path, numerics, kernel, grid, smem):
    plan, ctx = _plan(seed_path, numerics=numerics)
    launches = [l for g in plan.groups if g.family == "glm_mla_decode" for l in glm_mla_decode.lower(ctx, g)]
    assert launches and all(l.instance.kernel == kernel and l.grid == grid and l.smem == smem for l in launches)
