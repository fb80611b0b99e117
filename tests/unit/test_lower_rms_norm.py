"""Lowering of rms_norm groups: the plain norm (one launch per node, the reference's block size)
and the norm merged with its per-token FP8 quantizer (rule rms_norm_fp8_quant) as one launch."""
from __future__ import annotations

from kbpc.codegen.args import FloatLit, lit
from kbpc.codegen.families import rms_norm
from kbpc.reference.rms_norm import block_threads
from kbpc.testing.lowering import family_groups, planned, unwritten

BF = "__nv_bfloat16"


def test_plain_norms(tiny_path):
    plan, ctx = planned(str(tiny_path))
    groups = family_groups(plan, "rms_norm")
    assert groups
    for g in groups:
        launches = rms_norm.lower(ctx, g)
        assert len(launches) == len(g.nodes) and unwritten(plan, g, launches) == []
        for launch in launches:
            d = launch.args[1].value
            assert launch.instance.kernel.startswith(f"kbp::rms_norm<{d}, {block_threads(d)}, ")
            assert launch.args[8] == FloatLit(plan.blueprint.config.constants.rms_eps)


def test_norm_with_fp8_quant(tiny_path):
    plan, ctx = planned(str(tiny_path), fuse=True)
    bp = plan.blueprint
    fused = [g for g in plan.groups if g.rule == "fused:rms_norm_fp8_quant"]
    assert fused
    for g in fused:
        (launch,) = rms_norm.lower(ctx, g)
        norm, quant = (bp.node_by_id[n] for n in g.nodes)
        d = ctx.input(norm).dim_value
        one_plus = "false" if "vanilla" in (norm.kernel or "") else "true"
        assert launch.instance.kernel == f"kbp::rms_norm_quant_fp8<{d}, {block_threads(d)}, {one_plus}>"
        assert launch.nodes == (norm.id, quant.id) and launch.block == (block_threads(d), 1, 1)
        q = ctx.quant(ctx.output(quant))
        x, xs, w, eps, y, ys, codes, scales = launch.args
        assert x == ctx.buf(ctx.input(norm)) and xs == lit(d) and ys == lit(d)
        assert (codes, scales) == (q.codes, q.scales)
        # the normed BF16 row has another reader here (the indexer's query projection): written
        assert y == ctx.buf(ctx.output(norm))
        assert unwritten(plan, g, [launch]) == []
