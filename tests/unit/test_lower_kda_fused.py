"""Lowering of a merged KDA chain group (pack, conv + L2 norm, gates, recurrence, o-norm; the
fusion pass's rule kda_chain) to the fused kernel, on the tiny blueprint and the seed."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kbpc.codegen.args import NULL, ArenaPtr, StatePtr, WeightPtr, lit
from kbpc.codegen.context import LowerCtx, LoweringError
from kbpc.codegen.families import kda_fused as fused
from kbpc.reference.kda_recurrent import query_scale
from kbpc.testing.kda_chain import CHAIN_FAMILIES, bind, product_chain
from kbpc.testing.lowering import planned, points_into


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path), fuse=True)


def fused_groups(plan):
    found = [g for g in plan.groups if g.family == "kda_fused"]
    assert found
    return found


def test_split_choice():
    assert fused.value_head_split(64, 64, 128, 128, 4) == 2          # the seed: 128 CTAs of 64 threads
    assert not fused.split_fits(64, 64, 128, 128, 4, 1)              # 64 KB of state per CTA
    assert fused.value_head_split(2, 2, 128, 128, 4) == 4            # tiny: as many CTAs as fit
    assert fused.value_head_split(1, 3, 32, 64, 3) == 2              # grouped heads: a cluster of 6
    assert fused.smem_bytes(64, 64, 128, 128, 4, 2) < 48 * 1024
    with pytest.raises(LoweringError, match="no fused KDA split"):
        fused.value_head_split(1, 16, 128, 128, 4)                   # a cluster of > 8 CTAs
    assert fused.serves(list(fused.chain_rule().ops)[::-1]) and not fused.serves(["concat", "l2_norm"])


def test_merged_group_lowers_to_one_fused_launch(tiny):
    plan, ctx = tiny
    sym, c = plan.blueprint.symbols, plan.blueprint.config.constants
    hk, hv, dk, dv = sym["lin_k_heads"], sym["lin_v_heads"], sym["lin_k_dim"], sym["lin_v_dim"]
    state = [s.name for s in plan.state]
    for g in fused_groups(plan):
        (launch,) = fused.lower(ctx, g)
        layer = g.nodes[0].rsplit(".", 1)[0]
        cph = fused.value_head_split(hk, hv, dk, dv, c.conv_width)
        assert launch.instance.kernel == f"kbp::kda_fused_decode<{hk}, {hv}, {dk}, {dv}, {dk}, {dv}, {c.conv_width}, {cph}>"
        assert launch.grid == (hv * cph, 1, 1) and launch.block == (dv // cph, 1, 1) and launch.smem == 0
        a = launch.args
        assert len(a) == len(fused.PARAMS) == 30
        for arg, buf in zip(a[:6], ("q.q", "k.k", "v.v", "f_a.fa", "g_a.ga", "b.b")):
            assert points_into(arg, f"{layer}.{buf}")
        assert np.float32(a[16].value) == query_scale(dk) and a[18] == lit(0)
        assert a[20] == StatePtr(state.index(f"{layer}.short_conv.window"), f"{layer}.short_conv.window", "float")
        assert a[21] == StatePtr(state.index(f"{layer}.recur.state"), f"{layer}.recur.state", "float")
        assert points_into(a[22], f"{layer}.out_norm.gated")
        assert a[23:] == (NULL,) * 7, "the chain's inner edges have no buffers in a merged plan"
        assert launch.nodes == g.nodes


def test_kept_intermediates_are_written(tiny_path):
    """Inner edges that keep a buffer (here: put back by product_chain) are written by the kernel."""
    chain = product_chain(str(tiny_path))
    (fused,) = chain.fused
    a, b = fused.args, chain.block
    assert points_into(a[23], f"{b}.qkv.qkv") and points_into(a[24], f"{b}.l2.qkvn")
    assert a[25] == NULL   # f never had a buffer
    assert points_into(a[26], f"{b}.gates.decay") and points_into(a[27], f"{b}.gates.beta")
    assert points_into(a[28], f"{b}.g_b.g") and points_into(a[29], f"{b}.recur.core")


def test_fusion_pass_merges_every_kda_layer(tiny_path, seed_path):
    """Every KDA layer's five chain groups become one kda_fused group, which lowers to one launch."""
    for path in (tiny_path, seed_path):
        unfused, fused_plan = planned(str(path))[0], planned(str(path), fuse=True)[0]
        layers = sum(g.family == "kda_recurrent" for g in unfused.groups)
        merged = [g for g in fused_plan.groups if g.family == "kda_fused"]
        assert layers and len(merged) == layers and not any(g.family in CHAIN_FAMILIES for g in fused_plan.groups)
        assert all(g.rule == "fused:kda_chain" and g.variant == "fp8_mma" for g in merged)
        ctx = LowerCtx(fused_plan)
        assert all(len(fused.lower(ctx, g)) == 1 for g in merged[:3])


def test_a_partial_chain_is_refused(tiny_path):
    plan, ctx = planned(str(tiny_path))
    g = next(g for g in plan.groups if g.family == "kda_recurrent")
    with pytest.raises(LoweringError, match="whole KDA chain"):
        fused.lower(ctx, g)


class _Dev:
    """A stand-in device array: what bind reads of one (its address)."""
    def __init__(self, address: int):
        self.gpudata = address


def test_product_chain_binds_every_argument(tiny_path):
    """Both lowerings of the tiny example's first KDA layer bind to arrays by name: pointers become
    arrays or addresses (views keep their offsets), scalars numbers, nulls None."""
    chain = product_chain(str(tiny_path))
    assert [launch.instance.family for launch in chain.unfused] == list(CHAIN_FAMILIES)
    assert chain.dims == fused.KdaDims(2, 2, 128, 128, 128, 128, 4)
    names = {a.buffer if isinstance(a, ArenaPtr) else a.name for launch in chain.unfused + chain.fused
             for a in launch.args if isinstance(a, (ArenaPtr, WeightPtr, StatePtr))}
    arrays = {name: _Dev((i + 1) << 32) for i, name in enumerate(sorted(names))}
    for launch, plan in [(launch, chain.plan) for launch in chain.unfused] + [(launch, chain.merged) for launch in chain.fused]:
        for ctype, value in zip(launch.instance.params, bind(launch, plan, arrays), strict=True):
            if ctype.endswith("*"):
                assert value is None or isinstance(value, (_Dev, int)), (launch.instance.kernel, ctype, value)
            else:
                assert isinstance(value, (int, float)), (launch.instance.kernel, ctype, value)
    rec = next(launch for launch in chain.unfused if launch.instance.family == "kda_recurrent")
    q, k = bind(rec, chain.plan, arrays)[:2]
    assert k - q == 2 * chain.dims.hk * chain.dims.dk, "the k view is hk*dk BF16 values into the packed row"


def test_chain_fits_names_what_does_not_fit(tiny_path, seed_path):
    """The fusion rule's check: the tiny example's and the seed's chains fit; BF16 gates do not."""
    for path in (tiny_path, seed_path):
        plan = planned(str(path))[0]
        bp = plan.blueprint
        first = min((g for g in plan.groups if g.family == "kda_recurrent"), key=lambda g: g.id)
        block = bp.node_by_id[first.nodes[0]].block
        nodes = [n for n in bp.nodes() if n.block == block and n.op in fused.chain_rule().op_counts]
        assert fused.chain_fits(bp, nodes) is None
        bf16 = [dataclasses.replace(n, precision=dataclasses.replace(n.precision, weight="bf16"))
                if n.op_base == "linear" else n for n in nodes]
        assert "fp8/channel" in fused.chain_fits(bp, bf16)
