"""glm_mhc: the hyper-connection groups (kernels/glm_mhc.cuh, kernels/glm_mhc_boundary.cuh,
kernels/glm_mhc_boundary_cluster.cuh), one launch each.

- A pre-mix group (linear:hc_mix + hc_pre + rms_norm) lowers to a boundary kernel: mix GEMV, gates,
  Sinkhorn, collapse and the site RMSNorm, as hc_boundary (8 column groups x chains of producer
  CTAs handing their partial sums to two tail CTAs through slots in global memory) or, with
  BOUNDARY_CLUSTER on (off: measured slower), as hc_boundary_cluster (one cluster of CLUSTER_WIDTH
  CTAs a token, partial sums through distributed shared memory; hidden a multiple of 256 on a target
  allowing that width). What the fusion pass merged in front of it picks where the streams come
  from:
  * nothing (glm_hc_pre_norm_c1_*): the streams buffer as it is (kSrcStreams);
  * the previous site's hc_post (fused:hc_boundary): its post-mix, computed in the kernel, which
    writes the post node's stream buffer (the next post-mix reads it) and mixes from it (kSrcPost);
  * the embedding's hc_expand (fused:hc_expand_pre): the BF16 row widened into every stream, the
    expand's buffer written likewise (kSrcExpand);
  * a MoE layer's blend and the hc_post after it (fused:moe_combine_hc): as hc_boundary, with the
    post-mix's sublayer output computed in place by the combine (PreParams<N, 1, K>: the blend's
    operands, K routed slots, kernels/glm_moe_combine.cuh's moe_combine_sums); the blend's output
    never reaches memory.
  The collapsed row is written only when its edge has a buffer; the slot form's per-row x_out
  counters (`<hc_pre>.counters`) and partial-sum hand-off slots (`<hc_pre>.work`) are state buffers
  (kbpc.ir.state.hc_pre_state), zero at reset and left zero by every launch (the cluster form has
  them too and leaves them untouched). With GATES_ASIDE the
  boundary writes mu into `<hc_pre>.mix` and leaves the post gates, softmax and Sinkhorn to a second
  launch, hc_gates, marked aside for the post-mix that reads them (the launch pass issue_aside puts
  it on an extra stream); without it, mu is written only when its edge has a buffer and tail S runs
  them.
- fused:hc_head_norm (hc_post + hc_contract + final_norm): hc_head_norm, the last post-mix, the
  stream mean and the final RMSNorm in one CTA per row (the rms_norm family's reduction order);
  fused:moe_combine_head also holds the last MoE layer's blend (HeadParams<N, 1, K>).
- glm_hc_expand (hc_expand): hc_expand widens the BF16 embedding row into the N FP32 streams.
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
from kbpc.codegen.families.glm_moe_combine import combine_in
from kbpc.codegen.families.rms_norm import one_plus
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.buffers import buffer_name
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.records import Node, Tensor
from kbpc.ir.state import StateBuffer, hc_pre_state
from kbpc.reference.rms_norm import block_threads  # the final norm's reduction order
from kbpc.targets import get_target

HEADER = "glm_mhc.cuh"
BOUNDARY_HEADER = "glm_mhc_boundary.cuh"
CLUSTER_HEADER = "glm_mhc_boundary_cluster.cuh"
ROW_THREADS = 32       # expand / post / head: D / 128 small CTAs spread a few KB over many SMs
ROW_VEC = 4            # 16-byte FP32 stream accesses
PRE_THREADS = 288      # kbp::mhc::kPreThreads: 256 tree threads + the Sinkhorn warp
COL_GROUPS = 8         # kbp::mhc::kColGroups: CTAs per chain group
CHAINS_PER_CTA = 4     # hc_boundary's RPC: 56 producer CTAs per row at n_hc 4 (24 mix rows + the sum of squares)
TAIL_CTAS = 2          # kbp::mhc::kBoundaryTails: the Sinkhorn tail and the collapse tail of a row
MAX_FLAT = 81920       # kbp::mhc::kMaxBoundaryFlat: n_hc * hidden stream values (shared memory)
SRC = {None: 0, "hc_post": 1, "hc_expand": 2}  # kbp::mhc::StreamSource of the merged node's op
STREAM_OPS = ("hc_post", "hc_expand")
# The post gates, softmax and bit-exact Sinkhorn of a boundary (~1.8 us on one warp, serial) run in
# their own one-warp kernel beside the step (hc_gates, moved to an extra stream by the launch pass
# issue_aside), not in the boundary's tail S: the next post-mix, a sublayer later, is their only
# reader, but the boundary's dependents waited for its whole grid. Measured on an H200 (128-expert
# seed shrink, 1k context, logits bit-equal): replay span 5188 -> 5095 us, the KDA boundary 6.8 ->
# 6.3 us after its output projection, the MoE combine boundary 10.2 -> 9.0 us after the routed down;
# 90 launches more (bench/NOTES.md, sixteenth session).
GATES_ASIDE = True
# The boundary as one thread-block cluster a token (hc_boundary_cluster: partial sums through
# distributed shared memory, no slot hand-off, no tail CTAs), CLUSTER_WIDTH CTAs, where the hidden
# size is a multiple of the 256 tree threads and the target allows that width; the slot form
# elsewhere. Off: measured slower on an H200 (128-expert seed shrink, 1k context, logits bit-equal):
# 4.99-5.00 ms a step against 4.82 with the slot form, the boundary 7.3 us after the KDA output
# projection against 5.8 and 10.7 us after the routed down against 8.7 (bench/NOTES.md,
# twenty-seventh session; its loads and chains ended 2.3 us before the slot form's whole boundary,
# the path after its first cluster barrier lost). Measured before the collapse's pre gates moved to
# N threads, which cut that path too: re-measure before anything else. Kept, with its GPU tests.
BOUNDARY_CLUSTER = False
CLUSTER_WIDTH = 16


def boundary_cluster(n: int, d: int, max_cluster: int) -> int:
    """The boundary's cluster width for n_hc n and hidden size d on a target allowing max_cluster
    CTAs, or 0 for the slot form."""
    fits = d % 256 == 0 and max_cluster >= CLUSTER_WIDTH and cluster_threads(n, CLUSTER_WIDTH) <= 1024
    return CLUSTER_WIDTH if BOUNDARY_CLUSTER and fits else 0


def cluster_threads(n: int, cluster: int) -> int:
    """kbp::mhc::cluster_boundary_threads(N, CL): one lane per tree thread of a chain, CL / 8 chains a
    warp over the (2+N)N + 1 chains."""
    per_warp = cluster // 8
    return 32 * -(-((2 + n) * n + 1) // per_warp)


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    nodes = ctx.nodes(group)
    ops = sorted(n.op for n in nodes)
    blend = [n for n in nodes if n.op == "blend"]
    if "hc_pre" in ops:
        front = [n for n in nodes if n.op in STREAM_OPS]
        fits = len(front) <= 1 and len(blend) <= 1 and len(nodes) == 3 + len(front) + len(blend)
        require(fits and (not blend or (front and front[0].op == "hc_post")),
                f"glm_mhc has no kernel for the nodes {ops}", group)
        return _boundary(ctx, group, front[0] if front else None, blend[0] if blend else None)
    if [op for op in ops if op != "blend"] == ["final_norm", "hc_contract", "hc_post"] and len(blend) <= 1:
        return [_head_norm(ctx, group, blend[0] if blend else None)]
    require(len(nodes) == 1, f"glm_mhc has no kernel for the nodes {ops}", group)
    node = nodes[0]
    if node.op == "hc_expand":
        return [_expand(ctx, group, node)]
    if node.op == "hc_post":
        return [_post(ctx, group, node)]
    if node.op == "hc_contract":
        return [_head(ctx, group, node)]
    raise LoweringError(f"glm_mhc has no kernel for op {node.op}", f"node {node.id}")


def boundary_instance(n: int, d: int, src: int, ranks: int = 1, rpc: int = CHAINS_PER_CTA,
                      slots: int = 0, cluster: int = 0) -> KernelInstance:
    """kbp::mhc::hc_boundary<N, D, SRC, R, K, RPC>, or with a cluster width
    kbp::mhc::hc_boundary_cluster<N, D, SRC, R, K, CL>, taking one PreParams<N, R, K> by value (K > 0:
    the post-mix's u is the MoE combine of K routed slots, computed in the kernel)."""
    if cluster:
        return KernelInstance("glm_mhc", CLUSTER_HEADER,
                              f"kbp::mhc::hc_boundary_cluster<{n}, {d}, {src}, {ranks}, {slots}, {cluster}>",
                              (f"kbp::mhc::PreParams<{n}, {ranks}, {slots}>",), cluster=cluster)
    return KernelInstance("glm_mhc", BOUNDARY_HEADER,
                          f"kbp::mhc::hc_boundary<{n}, {d}, {src}, {ranks}, {slots}, {rpc}>",
                          (f"kbp::mhc::PreParams<{n}, {ranks}, {slots}>",))


def gates_instance(n: int) -> KernelInstance:
    """kbp::mhc::hc_gates<N>: the post gates, softmax and Sinkhorn of a site from its mix outputs mu."""
    return KernelInstance("glm_mhc", HEADER, f"kbp::mhc::hc_gates<{n}>",
                          ("const float*", "const float*", "const float*", "float", "int", "float*", "float*"))


def boundary_grid(n: int, rows: int, rpc: int = CHAINS_PER_CTA, cluster: int = 0) -> tuple[int, int, int]:
    """kbp::mhc::boundary_ctas(N, RPC) CTAs per row: 8 column groups x the chains in groups of RPC
    (the producers), then the two tails; or one cluster of `cluster` CTAs per row."""
    if cluster:
        return cluster, rows, 1
    return COL_GROUPS * -(-((2 + n) * n + 1) // rpc) + TAIL_CTAS, rows, 1


def boundary_block(n: int, cluster: int = 0) -> tuple[int, int, int]:
    """kPreThreads for the slot form, cluster_boundary_threads(N, CL) for the cluster form."""
    return (cluster_threads(n, cluster) if cluster else PRE_THREADS), 1, 1


def head_norm_instance(n: int, d: int, weight_one_plus: bool, post: bool, ranks: int = 1,
                       slots: int = 0) -> KernelInstance:
    """kbp::mhc::hc_head_norm<N, D, THREADS, ONE_PLUS, POST, R, K> (THREADS: the rms_norm block rule;
    K > 0: u is the MoE combine of K slots)."""
    flags = ", ".join("true" if f else "false" for f in (weight_one_plus, post))
    return KernelInstance("glm_mhc", BOUNDARY_HEADER,
                          f"kbp::mhc::hc_head_norm<{n}, {d}, {block_threads(d)}, {flags}, {ranks}, {slots}>",
                          (f"kbp::mhc::HeadParams<{n}, {ranks}, {slots}>",))


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


def _branch(ctx: LowerCtx, u: Tensor, blend: Node | None) -> tuple[int, int, Aggregate]:
    """(R, K, the params' `parts`) for a post-mix adding u: the rank partials (K = 0), or, with the
    blend that produces u merged in, the combine's operands (R = 1, K slots)."""
    if blend is None:
        ranks, parts = _parts(ctx, u)
        return ranks, 0, parts
    require(u.src == blend.order, f"the merged blend {blend.id} must produce the post-mix's input {u.id}", blend)
    require(ctx.tp is None, "a fused MoE combine has no tensor-parallel form (the blend is a rank's partial)", blend)
    k, operands = combine_in(ctx, blend)
    return 1, k, operands


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


def _fused_post(ctx: LowerCtx, post_node: Node, x: Tensor, blend: Node | None) -> tuple[int, int, tuple[Arg, ...]]:
    """(R, K, PreParams' / HeadParams' x, parts, post_in, comb_in, x_out) for a kernel that runs the
    post-mix producing its streams `x` (x_out: the post node's buffer, or NULL when nothing outside
    reads it; R: the rank partials the post-mix sums; K: the slots of a merged blend, or 0)."""
    px, u, post, comb, y = _post_operands(ctx, post_node)
    require(x.src == post_node.order, "the fused post-mix must produce the streams the kernel reads", post_node)
    ranks, k, parts = _branch(ctx, u, blend)
    return ranks, k, (ctx.buf(px, "const float"), parts, ctx.buf(post, "const float"),
                      ctx.buf(comb, "const float"), ctx.buf(y, "float") if materialized(ctx, y) else NULL)


def _stream_source(ctx: LowerCtx, front: Node | None, blend: Node | None,
                   x: Tensor) -> tuple[int, int, tuple[Arg, ...], Arg]:
    """R, K, (x, parts, post_in, comb_in, x_out) and h of PreParams for the streams `x` the pre-mix
    reads (R: the rank partials a fused post-mix sums, 1 otherwise; K: a merged blend's slots)."""
    no_parts = Aggregate(None, (Aggregate(None, (NULL,)),))
    if front is None:
        return 1, 0, (ctx.buf(x, "const float"), no_parts, NULL, NULL, NULL), NULL
    require(materialized(ctx, x), f"the streams {x.id} must have a buffer (the next post-mix reads them)", front)
    if front.op == "hc_post":
        ranks, k, fields = _fused_post(ctx, front, x, blend)
        return ranks, k, fields, NULL
    h = ctx.input(front)
    require(x.src == front.order and h.format == "bf16", f"{front.id} must expand a BF16 row into {x.id}", front)
    require(ctx.rows(h) == ctx.rows(x), f"{h.id} has {ctx.rows(h)} rows, {x.id} {ctx.rows(x)}", front)
    return 1, 0, (NULL, no_parts, NULL, NULL, ctx.buf(x, "float")), ctx.buf(h, f"const {BF16}")


def _boundary(ctx: LowerCtx, group: LoweredGroup, front: Node | None, blend: Node | None) -> list[Launch]:
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
    require(n * d <= MAX_FLAT, f"n_hc x hidden = {n * d}: the boundary kernel holds at most {MAX_FLAT}", pre)
    require(post.dim_value == n and comb.dim_value == n * n, f"post {post.dim_value}, comb {comb.dim_value}", pre)
    require(mix.precision.weight == "bf16", f"the mix matrix is {mix.precision.weight}, the kernel reads BF16", mix)
    iters = ctx.c.sinkhorn_iters
    require(iters >= 1, f"Sinkhorn needs at least one iteration, got {iters}", pre)
    rows = ctx.rows(x)
    require(all(ctx.rows(t) == rows for t in (post, comb, normed)), f"row counts disagree ({rows} streams)", pre)
    counters_state, work_state, mix_state = hc_pre_state(pre, rows, width)
    ranks, k, head, h = _stream_source(ctx, front, blend, x)
    params = f"kbp::mhc::PreParams<{n}, {ranks}, {k}>"
    # With GATES_ASIDE the boundary leaves the post gates and comb (comb = nullptr) to hc_gates, which
    # reads mu from the mix state the tails write.
    mu_out = _state(ctx, mix_state, "float", pre) if GATES_ASIDE else (
        ctx.buf(mu, "float") if materialized(ctx, mu) else NULL)
    # Field order of PreParams: x, parts, post_in, comb_in, x_out, phi, alpha, beta, gamma, eps_n,
    # eps_hc, eps, iters, mix, counters, collapsed, normed, post, comb, h, work.
    fields = (*head, ctx.weight(mix, ctype=BF16), ctx.weight(pre, "alpha", "float"), ctx.weight(pre, "beta", "float"),
              ctx.weight(norm, ctype=BF16), flt(ctx.c.hc_norm_eps), flt(ctx.c.hc_eps), flt(ctx.c.hc_site_norm_eps),
              lit(iters), mu_out,
              _state(ctx, counters_state, "unsigned int", pre), ctx.buf(u) if materialized(ctx, u) else NULL,
              ctx.buf(normed), ctx.buf(post, "float"), NULL if GATES_ASIDE else ctx.buf(comb, "float"), h,
              _state(ctx, work_state, "unsigned int", pre))
    nodes = tuple(nd.id for nd in (blend, front) if nd is not None) + (mix.id, pre.id, norm.id)
    cluster = boundary_cluster(n, d, get_target(ctx.plan.options.target).max_cluster)
    inst = boundary_instance(n, d, SRC[front.op if front else None], ranks=ranks, slots=k, cluster=cluster)
    boundary = Launch(inst, grid=boundary_grid(n, rows, cluster=cluster), block=boundary_block(n, cluster), smem=0,
                      args=(Aggregate(params, fields),), group=group.id, nodes=nodes)
    if not GATES_ASIDE:
        return [boundary]
    readers = tuple(sorted({ctx.bp.node(t.dst).id for t in ctx.bp.outputs(pre.order) if t.id in (post.id, comb.id)}))
    require(readers, f"nothing reads {pre.id}'s post gates and comb", pre)
    gates = Launch(gates_instance(n), grid=(rows, 1, 1), block=(32, 1, 1), smem=0,
                   args=(ctx.state(mix_state.name, "const float"), ctx.weight(pre, "alpha", "float"),
                         ctx.weight(pre, "beta", "float"), flt(ctx.c.hc_eps), lit(iters), ctx.buf(post, "float"),
                         ctx.buf(comb, "float")),
                   group=group.id, nodes=(pre.id,), aside=readers)
    return [boundary, gates]


def _head_norm(ctx: LowerCtx, group: LoweredGroup, blend: Node | None) -> Launch:
    """The last post-mix (behind a merged blend, if any), the stream mean and the final RMSNorm (the
    rms_norm family's math)."""
    post, contract, norm = (ctx.node(group, op) for op in ("hc_post", "hc_contract", "final_norm"))
    x, head, normed = ctx.input(contract), ctx.output(contract), ctx.output(norm)
    require(ctx.input(norm).src == contract.order, f"{norm.id} does not normalise the stream mean", norm)
    n, d = streams_of(x, head, contract)
    require(d % 2 == 0 and normed.dim_value == d, f"the final norm reads BF16 pairs of a {d}-wide row", norm)
    rows = ctx.rows(x)
    require(all(ctx.rows(t) == rows for t in (head, normed)), f"row counts disagree ({rows} streams)", contract)
    ranks, k, front = _fused_post(ctx, post, x, blend)
    params = f"kbp::mhc::HeadParams<{n}, {ranks}, {k}>"
    # Field order of HeadParams: x, parts, post_in, comb_in, x_out, gamma, eps, head, normed.
    fields = (*front, ctx.weight(norm, ctype=BF16), flt(ctx.c.rms_eps),
              ctx.buf(head) if materialized(ctx, head) else NULL, ctx.buf(normed))
    nodes = ((blend.id,) if blend is not None else ()) + (post.id, contract.id, norm.id)
    return Launch(head_norm_instance(n, d, one_plus(norm), post=True, ranks=ranks, slots=k), grid=(rows, 1, 1),
                  block=(block_threads(d), 1, 1), smem=0, args=(Aggregate(params, fields),), group=group.id,
                  nodes=nodes)
