"""Lowering of kda_gates_w8a8 groups (glm_kda_gates_w8a8_rows_1row) on the tiny blueprint: five
nodes, one launch; f and the FP8 token rows stay on chip."""
from __future__ import annotations

import pytest

from kbpc.codegen.args import FloatLit, NULL, lit
from kbpc.codegen.families import kda_gates_w8a8 as gates
from kbpc.testing.lowering import points_into, family_groups, planned, unwritten

BF = "__nv_bfloat16"


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return planned(str(tiny_path))


def test_gate_blocks():
    assert gates.gate_blocks(8192) == 128 and gates.gate_blocks(48) == 1 and gates.gate_blocks(192, 2) == 6


def test_gates_launches(tiny):
    plan, ctx = tiny
    groups = family_groups(plan, "kda_gates_w8a8")
    assert groups and {g.rule for g in groups} == {"glm_kda_gates_w8a8_rows_1row"}
    sym, c = plan.blueprint.symbols, plan.blueprint.config.constants
    buffers = {b.name for b in plan.buffers}
    for g in groups:
        (launch,) = gates.lower(ctx, g)
        layer = g.nodes[0].rsplit(".", 1)[0]           # e.g. l0.kda
        quant = plan.blueprint.node_by_id[f"{layer}.fa_quant"]
        k = plan.blueprint.inputs(quant.order)[0].dim_value
        n, h = sym["lin_v_heads"] * sym["lin_k_dim"], sym["lin_v_heads"]
        assert launch.instance.kernel == f"kbp::kda_gates_w8a8_k128_rows<{n}, {k}, {n // h}, 4>"
        assert len(launch.instance.params) == len(launch.args) == 21
        assert launch.grid == (2 * -(-(n // 16) // 4), 1, 1) and launch.block == (128, 1, 1) and launch.smem == 0
        assert launch.nodes == g.nodes
        a = launch.args
        assert points_into(a[0], f"{layer}.f_a.fa") and points_into(a[1], f"{layer}.g_a.ga")
        assert a[2:4] == (lit(k), lit(1))
        assert a[4:8] == (ctx.weight(f"{layer}.f_b"), ctx.weight(f"{layer}.f_b", "weight_scale", "float"),
                          ctx.weight(f"{layer}.g_b"), ctx.weight(f"{layer}.g_b", "weight_scale", "float"))
        assert a[8:10] == (ctx.weight(f"{layer}.gates", "A_log", "float"),
                           ctx.weight(f"{layer}.gates", "dt_bias", "float"))
        assert a[10] == FloatLit(c.kda_gate_lower_bound)
        assert points_into(a[11], f"{layer}.b.b") and a[12] == lit(h)
        assert points_into(a[13], f"{layer}.gates.decay") and a[13].ctype == "float" and a[14] == lit(n)
        assert points_into(a[15], f"{layer}.g_b.g") and a[16] == lit(n)
        assert points_into(a[17], f"{layer}.gates.beta") and a[17].ctype == "float" and a[18] == lit(h)
        assert f"{layer}.f_b.f" not in buffers and a[19] == NULL    # f is fused
        assert unwritten(plan, g, [launch]) == []
        fused = [b for b in buffers if b.startswith(f"{layer}.") and b.split(".")[2] in ("fa_quant", "ga_quant")]
        assert fused == []                                                # FP8 rows stay on chip
