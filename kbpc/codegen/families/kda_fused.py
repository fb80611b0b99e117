"""kda_fused: a KDA layer's whole non-projection chain in one launch (kernels/kda_fused.cuh), for a
group holding the nodes of the five KDA groups (pack, conv + L2 norm, gates, recurrence, gated
o-norm) that the fusion pass merged (rule kda_chain in kbpc/passes/fusion_rules.py). It reads the projections' q, k, v, f_a, b, g_a rows and writes
the gated output; every edge inside the chain stays on chip unless the plan gave it a buffer (a
later reader, or the debug arena), which the kernel then writes too. The conv window and the
recurrent state keep the unfused kernels' layouts and advance in place.

The work split (see the header): one cluster of (H_v/H_k) * CPH CTAs per key head, CPH CTAs per
value head, DV/CPH value columns (threads) per CTA. `value_head_split` picks CPH: the fewest CTAs
per head that reach TARGET_CTAS CTAs in all, within the kernel's limits."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kbpc.codegen.args import NULL, Arg, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families._projection import materialized, require
from kbpc.codegen.families.causal_conv1d_l2norm import qk_channels
from kbpc.codegen.families.kda_gates_w8a8 import fp8_gates_fit, gate_projection
from kbpc.codegen.families.kda_recurrent import query_scale
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.graph import Blueprint
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.passes.fusion_rules import FUSION_RULES, FusionRule

BF = "__nv_bfloat16"
HEADER = "kda_fused.cuh"
TARGET_CTAS = 128          # about one CTA per SM of an H100/H200 (132 SMs)
SPLITS = (1, 2, 4, 8)      # CTAs per value head
MAX_CLUSTER = 8            # portable cluster size
SMEM_LIMIT = 48 * 1024     # static shared memory
PARAMS = (f"const {BF}*", f"const {BF}*", f"const {BF}*", f"const {BF}*", f"const {BF}*", f"const {BF}*",
          f"const {BF}*", f"const {BF}*", "float", "const uint8_t*", "const float*", "const uint8_t*",
          "const float*", "const float*", "const float*", "float", "float", f"const {BF}*", "int", "float",
          "float*", "float*", f"{BF}*", f"{BF}*", f"{BF}*", f"{BF}*", "float*", "float*", f"{BF}*", "float*")


@dataclass(frozen=True)
class KdaDims:
    """A KDA layer's sizes: key heads, value heads, d_k, d_v, the f and g gate ranks, conv width."""
    hk: int
    hv: int
    dk: int
    dv: int
    kf: int
    kg: int
    width: int

    @property
    def channels(self) -> int:
        """Packed q|k|v channels (the conv window's rows)."""
        return 2 * self.hk * self.dk + self.hv * self.dv


@dataclass(frozen=True)
class KdaShape:
    """Template arguments of kbp::kda_fused_decode: the sizes and CPH, the CTAs per value head."""
    dims: KdaDims
    cph: int

    @property
    def cluster(self) -> int:
        return self.dims.hv // self.dims.hk * self.cph

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.dims.hk * self.cluster, 1, 1)

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.dims.dv // self.cph, 1, 1)


def smem_bytes(hk: int, hv: int, dk: int, dv: int, width: int, cph: int) -> int:
    """sizeof(KdaFusedSmem): the state slice plus the staged factors, in a 16-byte aligned struct."""
    cols = dv // cph
    raw = 4 * (dk * cols + 3 * dk + (width + 1) * 2 * dk + 2 * dk // 32 + dk // cph + cols + cols // 32)
    return -(-raw // 16) * 16


def split_fits(hk: int, hv: int, dk: int, dv: int, width: int, cph: int) -> bool:
    """Whether the kernel's static limits hold for CPH CTAs per value head."""
    cols = dv // cph if dv % cph == 0 else 0
    return (hv % hk == 0 and cols % 32 == 0 and cols > 0 and dk % cph == 0 and (dk // cph) % 16 == 0
            and dk % 32 == 0 and dv <= 1024 and hv // hk * cph <= MAX_CLUSTER
            and smem_bytes(hk, hv, dk, dv, width, cph) <= SMEM_LIMIT)


def value_head_split(hk: int, hv: int, dk: int, dv: int, width: int) -> int:
    """CPH: the smallest split that fits and gives >= TARGET_CTAS CTAs, else the largest that fits."""
    fits = [c for c in SPLITS if split_fits(hk, hv, dk, dv, width, c)]
    if not fits:
        raise LoweringError(f"no fused KDA split fits H_k={hk}, H_v={hv}, d_k={dk}, d_v={dv}, conv width "
                            f"{width} (needs d_v/CPH a multiple of 32, d_k/CPH of 16, a cluster of <= "
                            f"{MAX_CLUSTER} CTAs and <= {SMEM_LIMIT} bytes of shared memory)")
    return next((c for c in fits if hv * c >= TARGET_CTAS), fits[-1])


def instance(shape: KdaShape) -> KernelInstance:
    d = shape.dims
    return KernelInstance("kda_fused", HEADER,
                          f"kbp::kda_fused_decode<{d.hk}, {d.hv}, {d.dk}, {d.dv}, {d.kf}, {d.kg}, {d.width}, {shape.cph}>",
                          PARAMS)


def chain_rule() -> FusionRule:
    """The fusion rule whose merged groups this lowering serves (kbpc/passes/fusion_rules.py)."""
    return next(r for r in FUSION_RULES if r.family == "kda_fused")


def serves(ops: list[str]) -> bool:
    """Whether a group's node ops (Node.op, any order) are exactly the KDA chain's."""
    return Counter(ops) == chain_rule().op_counts


def chain_fits(bp: Blueprint, nodes: list[Node]) -> str | None:
    """Why the fused kernel cannot serve a KDA chain's nodes (None: it can): the gate projections
    must be FP8 per-channel weights on per-token FP8 rows of width a multiple of 128, and a split
    must fit the kernel's limits."""
    by_op = {n.op: n for n in nodes}
    refusal = fp8_gates_fit(bp, nodes)
    if refusal:
        return refusal
    sym, width = bp.symbols, bp.config.constants.conv_width
    hk, dk = sym["lin_k_heads"], sym["lin_k_dim"]
    hv = next(t for t in bp.inputs(by_op["gdn_gates"].order) if t.id.rsplit(".", 1)[-1] == "b").dim_value
    v = bp.inputs(by_op["concat"].order)[2].dim_value
    if hv == 0 or v % hv:
        return f"v width {v} is not {hv} value heads"
    try:
        value_head_split(hk, hv, dk, v // hv, width)
    except LoweringError as exc:
        return str(exc)
    return None


def _optional(ctx: LowerCtx, t: Tensor, ctype: str) -> Arg:
    """An intermediate the kernel writes only when the plan keeps it as a buffer."""
    return ctx.buf(t, ctype) if materialized(ctx, t) else NULL


def _nodes(ctx: LowerCtx, group: LoweredGroup) -> dict[str, Node]:
    nodes = ctx.nodes(group)
    require(serves([n.op for n in nodes]), f"kda_fused serves the whole KDA chain, not the nodes "
            f"{[n.op for n in nodes]}", group)
    by_op = {n.op_base: n for n in nodes if n.op_base not in ("linear", "act_quant")}
    gates = by_op["gdn_gates"]
    by_op["f_b"] = ctx.bp.node(ctx.input(gates, "f").src)
    by_op["g_b"] = next(n for n in nodes if n.op_base == "linear" and n.id != by_op["f_b"].id)
    return by_op


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    n = _nodes(ctx, group)
    pack, conv, recur, norm, gates = (n[o] for o in ("concat", "conv1d_update", "gdn_recurrence",
                                                      "gated_rms_norm", "gdn_gates"))
    q, k, v = ctx.inputs(pack)
    f_b, xf = gate_projection(ctx, n["f_b"])
    g_b, xg = gate_projection(ctx, n["g_b"])
    b, y = ctx.input(gates, "b"), ctx.output(norm)
    hk, dk, hv = ctx.sym["lin_k_heads"], ctx.sym["lin_k_dim"], b.dim_value
    dv, width = v.dim_value // max(hv, 1), ctx.c.conv_width
    require(q.dim_value == k.dim_value == hk * dk and v.dim_value == hv * dv and qk_channels(ctx, conv) == 2 * hk * dk
            and y.dim_value == hv * dv and ctx.output(f_b).dim_value == hv * dk and ctx.output(g_b).dim_value == hv * dv,
            f"KDA widths: q {q.dim_value}, k {k.dim_value}, v {v.dim_value}, H_k={hk}, d_k={dk}, H_v={hv}", group)
    require(xf.dim_value % 128 == 0 and xg.dim_value % 128 == 0,
            f"the gate ranks {xf.dim_value}, {xg.dim_value} must be multiples of 128", group)
    require(all(ctx.rows(t) == 1 for t in (q, k, v, xf, xg, b, y)), "one decode token of one sequence", group)
    require(ctx.c.kda_gate_lower_bound < 0, f"the gate lower bound must be negative, got "
            f"{ctx.c.kda_gate_lower_bound}", group)
    shape = KdaShape(KdaDims(hk, hv, dk, dv, xf.dim_value, xg.dim_value, width), value_head_split(hk, hv, dk, dv, width))
    gamma = ctx.weight(norm, ctype=BF)
    args = (ctx.buf(q, f"const {BF}"), ctx.buf(k, f"const {BF}"), ctx.buf(v, f"const {BF}"),
            ctx.buf(xf, f"const {BF}"), ctx.buf(xg, f"const {BF}"), ctx.buf(b, f"const {BF}"),
            ctx.weight(conv, "conv_weight", BF), ctx.weight(conv, "conv_bias", BF), flt(ctx.c.l2_norm_eps),
            ctx.weight(f_b), ctx.weight(f_b, "weight_scale", "float"),
            ctx.weight(g_b), ctx.weight(g_b, "weight_scale", "float"),
            ctx.weight(gates, "A_log", "float"), ctx.weight(gates, "dt_bias", "float"),
            flt(ctx.c.kda_gate_lower_bound), flt(query_scale(dk)), gamma, lit(0), flt(ctx.c.kda_norm_eps),
            ctx.state(f"{conv.id}.window", "float"), ctx.state(f"{recur.id}.state", "float"), ctx.buf(y),
            _optional(ctx, ctx.output(pack), BF), _optional(ctx, ctx.output(n["l2_norm"]), BF),
            _optional(ctx, ctx.output(f_b), BF), _optional(ctx, ctx.output(gates, "decay"), "float"),
            _optional(ctx, ctx.output(gates, "beta"), "float"), _optional(ctx, ctx.output(g_b), BF),
            _optional(ctx, ctx.output(recur), "float"))
    return [Launch(instance(shape), grid=shape.grid, block=shape.block, smem=0, args=args, group=group.id,
                   nodes=tuple(group.nodes))]
