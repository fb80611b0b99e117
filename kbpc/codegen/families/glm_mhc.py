"""glm_mhc: the hyper-connection groups (kernels/glm_mhc.cuh), one launch each.

- hc boundary (a group the fusion pass merged: hc_post + linear:hc_mix + hc_pre + rms_norm):
  hc_pre_norm with FUSE_POST: the previous site's post-mix is computed in the pre-mix kernel, which
  writes the new streams (the post node's buffer, read by the next post-mix) and mixes from them.

- glm_hc_expand (hc_expand): hc_expand widens the BF16 embedding row into the N FP32 streams.
- glm_hc_pre_norm_c1_input / _c1_post (linear:hc_mix + hc_pre + rms_norm): hc_pre_norm without the
  fused post-mix (the streams come from a separate glm_hc_post group): mix GEMV, gates, Sinkhorn,
  collapse and the site RMSNorm. mu (the mix edge) and the collapsed row stay on chip when their
  edges are fused; mu then lives in the `<hc_pre>.mix` state buffer (the last CTA of a token reads
  every CTA's mu back), and the per-token arrival counters in `<hc_pre>.counters` (zero at reset,
  left zero by the kernel).
- glm_hc_post (hc_post): hc_post with R rank partials (R = 1 without tensor parallelism: u is the
  sublayer's BF16 output as is; a rank of a split step reads every rank's slot of the collective
  region, kbpc/codegen/collectives.py), writing the node's own stream buffer (never in place: the blueprint's stream
  edges are `<prev>.y` in, `<this post>.y` out).
- glm_hc_contract (hc_contract): hc_head, the stream mean rounded to BF16.

N (n_hc) and D (hidden) come from the edges: a stream row is N*D wide, a BF16 row D."""
from __future__ import annotations

from kbpc.codegen.args import NULL, Aggregate, Arg, StatePtr, lit
from kbpc.codegen.collectives import rank_parts
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families._projection import materialized, require
from kbpc.codegen.families._rows import BF16, row_grid, split_inputs, vec_width
from kbpc.codegen.families.dsa_state import state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.buffers import buffer_name
from kbpc.ir.state import StateBuffer, hc_pre_state

HEADER = "glm_mhc.cuh"
ROW_THREADS = 32       # expand / post / head: D / 128 small CTAs spread a few KB over many SMs
ROW_VEC = 4            # 16-byte FP32 stream accesses
PRE_THREADS = 288      # kbp::mhc::kPreThreads: 256 tree threads + the Sinkhorn warp
STREAM_OPS = ("hc_post", "hc_expand")


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    nodes = ctx.nodes(group)
    if any(n.op == "hc_pre" for n in nodes):
        posts = [n for n in nodes if n.op == "hc_post"]
        require(len(posts) <= 1 and len(nodes) == 3 + len(posts),
                f"glm_mhc has no kernel for the nodes {[n.op for n in nodes]}", group)
        return [_pre_norm(ctx, group, posts[0] if posts else None)]
    require(len(nodes) == 1, f"glm_mhc has no kernel for the nodes {[n.op for n in nodes]}", group)
    node = nodes[0]
    if node.op == "hc_expand":
        return [_expand(ctx, group, node)]
    if node.op == "hc_post":
        return [_post(ctx, group, node)]
    if node.op == "hc_contract":
        return [_head(ctx, group, node)]
    raise LoweringError(f"glm_mhc has no kernel for op {node.op}", f"node {node.id}")


def streams_of(stream: Tensor, row: Tensor, node: Node) -> tuple[int, int]:
    """(N, D) from a stream edge (N*D FP32 values per token) and a BF16 row edge (D)."""
    d = row.dim_value
    require(d > 0 and stream.dim_value % d == 0, f"stream width {stream.dim_value} is not n_hc x {d}", node)
    return stream.dim_value // d, d


def _row_launch(ctx: LowerCtx, group: LoweredGroup, node: Node, kernel: str, params: tuple[str, ...],
                args: tuple[str, ...], d: int, rows: int) -> Launch:
    inst = KernelInstance("glm_mhc", HEADER, kernel, params)
    return Launch(inst, grid=row_grid(d, ROW_THREADS, vec_width(d, ROW_VEC), rows), block=(ROW_THREADS, 1, 1),
                  smem=0, args=args, group=group.id, nodes=(node.id,))


def _expand(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    h, x = ctx.input(node), ctx.output(node)
    n, d = streams_of(x, h, node)
    rows = ctx.rows(h)
    require(ctx.rows(x) == rows, f"{x.id} has {ctx.rows(x)} rows, {h.id} {rows}", node)
    return _row_launch(ctx, group, node, f"kbp::mhc::hc_expand<{n}, {d}, {vec_width(d, ROW_VEC)}>",
                       (f"const {BF16}*", "float*"), (ctx.buf(h, f"const {BF16}"), ctx.buf(x, "float")), d, rows)


def _post_operands(ctx: LowerCtx, node: Node) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(streams in, sublayer output u, post gates, comb matrix, streams out) of an hc_post node."""
    streams, _ = split_inputs(ctx, node, *STREAM_OPS)
    gates, branch = split_inputs(ctx, node, "hc_pre")
    branch = [t for t in branch if t not in streams]
    require(len(streams) == 1 and len(branch) == 1, "hc_post needs one stream input and one sublayer output", node)
    by_name = {t.id.rsplit(".", 1)[-1]: t for t in gates}
    require(set(by_name) >= {"post", "comb"}, "hc_post needs the hc_pre node's post and comb", node)
    x, u, post, comb, y = streams[0], branch[0], by_name["post"], by_name["comb"], ctx.output(node)
    n, d = streams_of(x, u, node)
    require(post.dim_value == n and comb.dim_value == n * n and y.dim_value == n * d,
            f"post {post.dim_value}, comb {comb.dim_value}, out {y.dim_value} for n_hc {n}, hidden {d}", node)
    require(u.format == "bf16", f"the sublayer output {u.id} is {u.format}, the post-mix reads BF16", node)
    require(buffer_name(ctx.bp, x) != buffer_name(ctx.bp, y), "the post-mix writes a new stream buffer", node)
    rows = ctx.rows(x)
    require(all(ctx.rows(t) == rows for t in (u, post, comb, y)), f"row counts disagree ({rows} streams)", node)
    return x, u, post, comb, y


def _parts(ctx: LowerCtx, u: Tensor) -> tuple[int, Aggregate]:
    """(R, the rank partial outputs): one rank's sublayer output as is, or every rank's slot."""
    return rank_parts(ctx.tp, ctx.buf(u, f"const {BF16}"), buffer_name(ctx.bp, u))


def _post(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, u, post, comb, y = _post_operands(ctx, node)
    n, d = streams_of(x, u, node)
    rows = ctx.rows(x)
    ranks, parts = _parts(ctx, u)
    return _row_launch(ctx, group, node, f"kbp::mhc::hc_post<{n}, {d}, {ranks}, {vec_width(d, ROW_VEC)}>",
                       ("const float*", parts.ctype, "const float*", "const float*", "float*"),
                       (ctx.buf(x, "const float"), parts, ctx.buf(post, "const float"), ctx.buf(comb, "const float"), ctx.buf(y, "float")), d, rows)


def _head(ctx: LowerCtx, group: LoweredGroup, node: Node) -> Launch:
    x, y = ctx.input(node), ctx.output(node)
    n, d = streams_of(x, y, node)
    rows = ctx.rows(x)
    require(ctx.rows(y) == rows, f"{y.id} has {ctx.rows(y)} rows, {x.id} {rows}", node)
    return _row_launch(ctx, group, node, f"kbp::mhc::hc_head<{n}, {d}, {vec_width(d, ROW_VEC)}>",
                       ("const float*", f"{BF16}*"), (ctx.buf(x, "const float"), ctx.buf(y)), d, rows)


def _state(ctx: LowerCtx, want: StateBuffer, ctype: str, node: Node) -> StatePtr:
    buf = state_buffer(ctx, want.name)
    require(buf.nbytes >= want.nbytes, f"state {want.name} holds {buf.nbytes} bytes, the pre-mix needs "
            f"{want.nbytes}", node)
    return ctx.state(want.name, ctype)


def _fused_post(ctx: LowerCtx, post_node: Node, x: Tensor) -> tuple[int, tuple[Arg, ...]]:
    """(R, PreParams' x, parts, post_in, comb_in, x_out) for a pre-mix that runs the previous
    post-mix."""
    px, u, post, comb, y = _post_operands(ctx, post_node)
    require(x.src == post_node.order, "the fused post-mix must produce the streams the pre-mix reads", post_node)
    require(materialized(ctx, y), f"the post-mix output {y.id} must have a buffer (the next post-mix reads it)",
            post_node)
    ranks, parts = _parts(ctx, u)
    return ranks, (ctx.buf(px, "const float"), parts, ctx.buf(post, "const float"),
                   ctx.buf(comb, "const float"), ctx.buf(y, "float"))


def _pre_norm(ctx: LowerCtx, group: LoweredGroup, post_node: Node | None) -> Launch:
    mix, pre, norm = ctx.node(group, "linear:hc_mix"), ctx.node(group, "hc_pre"), ctx.node(group, "rms_norm")
    x, mu = ctx.input(mix), ctx.output(mix)
    streams, _ = split_inputs(ctx, pre, *STREAM_OPS)
    require(len(streams) == 1 and streams[0].src == x.src, "hc_mix and hc_pre read different streams", pre)
    u, post, comb, normed = ctx.output(pre, "u"), ctx.output(pre, "post"), ctx.output(pre, "comb"), ctx.output(norm)
    require(ctx.input(norm).src == pre.order, f"{norm.id} does not normalise the collapsed row", norm)
    n, d = streams_of(x, normed, pre)
    width = (2 + n) * n
    require(mu.dim_value == width, f"mix width {mu.dim_value} is not (2+n)n for n_hc {n}", mix)
    require(n * n <= 32, f"n_hc {n}: the Sinkhorn warp holds the n x n comb matrix (n*n <= 32)", pre)
    require(post.dim_value == n and comb.dim_value == n * n, f"post {post.dim_value}, comb {comb.dim_value}", pre)
    require(mix.precision.weight == "bf16", f"the mix matrix is {mix.precision.weight}, the kernel reads BF16", mix)
    iters = ctx.c.sinkhorn_iters
    require(iters >= 1, f"Sinkhorn needs at least one iteration, got {iters}", pre)
    rows = ctx.rows(x)
    require(all(ctx.rows(t) == rows for t in (post, comb, normed)), f"row counts disagree ({rows} streams)", pre)
    counters_state, mix_state = hc_pre_state(pre, rows, width)
    mu_ptr = ctx.buf(mu, "float") if materialized(ctx, mu) else _state(ctx, mix_state, "float", pre)
    counters = _state(ctx, counters_state, "unsigned int", pre)
    collapsed = ctx.buf(u) if materialized(ctx, u) else NULL
    # Field order of PreParams: x, parts, post_in, comb_in, x_out (the fused post-mix, else unused),
    # phi, alpha, beta, gamma, eps_n, eps_hc, eps, iters, mix, counters, collapsed, normed, post, comb.
    ranks, head = (_fused_post(ctx, post_node, x) if post_node is not None else
                   (1, (ctx.buf(x, "const float"), Aggregate(None, (Aggregate(None, (NULL,)),)), NULL, NULL, NULL)))
    params = f"kbp::mhc::PreParams<{n}, {ranks}>"
    fields = (*head, ctx.weight(mix, ctype=BF16), ctx.weight(pre, "alpha", "float"), ctx.weight(pre, "beta", "float"),
              ctx.weight(norm, ctype=BF16), flt(ctx.c.hc_norm_eps), flt(ctx.c.hc_eps), flt(ctx.c.hc_site_norm_eps),
              lit(iters), mu_ptr, counters, collapsed, ctx.buf(normed), ctx.buf(post, "float"),
              ctx.buf(comb, "float"))
    fuse = "true" if post_node is not None else "false"
    inst = KernelInstance("glm_mhc", HEADER, f"kbp::mhc::hc_pre_norm<{n}, {d}, {fuse}, {ranks}>", (params,))
    nodes = ((post_node.id,) if post_node is not None else ()) + (mix.id, pre.id, norm.id)
    return Launch(inst, grid=(width, rows, 1), block=(PRE_THREADS, 1, 1), smem=0,
                  args=(Aggregate(params, fields),), group=group.id, nodes=nodes)
