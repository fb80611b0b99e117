"""dsa_indexer: the DSA lightning indexer (kernels/dsa_indexer.cuh), one decode row.

glm_index_store (kpool_compress): dsa_indexer_store writes the token's BF16 key and gate into the
`tail_keys`/`tail_gates` state (K_P rows: the incomplete pool) and, when the token completes a
pool, the pool key: FP32 into `pool_keys`, or with the fp8 index cache (Options.index_cache) its
Walsh-Hadamard rotated E4M3 codes into `pool_codes` and its scale into `pool_scales`. The
blueprint plans a second kernel for the pool-key store; here one kernel does both.

fused:dsa_key_store (rule dsa_key_store: the key's layer_norm + kpool_compress): one launch of
dsa_indexer_store_norm computes the key's LayerNorm in the store's block (layer_norm.cuh's
arithmetic, one channel a thread) and stores it as above; the normalised key has no buffer.

glm_index_select_persisted (index_select): one launch of dsa_index_select over the whole GPU (one
CTA per SM of the target) scores every valid pool, selects the top-k pools in the blueprint's total
order and expands them (and the tail pool) to token ids: one launch for the blueprint's four
(scores, a two-pass multi-CTA top-k, expansion). Its scratch is state of the select node
(kbpc/ir/state.py, kind index:read): scores, the first-digit histogram, the arrival and
listed-candidate counters and, past 8192 pools, the list of scores each CTA found could still be
selected (the last CTA reads that list instead of every score; the selection is the same).

Numerics `fast` with the fp8 index cache picks the select's rotated-query form (template flag
QROT): each head's query is rotated once and a pool's score is a dot product with its codes times
its scale, instead of rotating every pool key back; it rounds differently, within
kbpc.reference.dsa_indexer.rotated_score_bound. `exact` keeps the read-back (the reference's bits).
Numerics `fast` with the f32 cache picks the tensor-core form (template flag MMA): queries and pool
keys rounded to BF16, FP32 accumulation on mma.sync (the explain's tensor-core score path), within
kbpc.reference.dsa_indexer.bf16_score_bound; `exact` keeps the lane-strided FP32 order.
Numerics `fast` also sets ORDER_FREE: the fast MLA decode takes the selection as a set, so the select
lists the top k pools in index order rather than by rank (kbpc.reference.dsa_indexer.
index_order_selection: no sort), and while the top k holds every valid pool (contexts up to
index_topk tokens) it lists them without scoring any (order_free_selection); `exact` ranks them by
score, since the exact decode accumulates in list order.

Geometry is read on the device: SEQ (cached tokens with this one) and POS (its position)."""
from __future__ import annotations

from kbpc.codegen.args import NULL, StepInput, lit
from kbpc.codegen.context import LowerCtx, LoweringError, flt
from kbpc.codegen.families.dsa_state import block_node, one_row, state_buffer
from kbpc.codegen.records import KernelInstance, Launch
from kbpc.ir.buffers import buffer_elements
from kbpc.ir.ops import selection_is_a_set
from kbpc.ir.plan import LoweredGroup
from kbpc.ir.state import INDEX_SELECT_BIN_BITS, INDEX_SELECT_FILTER_CAP
from kbpc.reference.layer_norm import block_threads  # the norm's block rule: one thread a channel
from kbpc.targets import get_target

BF = "__nv_bfloat16"
SELECT_THREADS = 512     # DSA_SELECT_THREADS
SELECT_CHUNK = 32        # DSA_SELECT_CHUNK: pools a CTA stages at a time
MAX_HEADS, MAX_HEAD_DIM = 128, 128
STORE_PARAMS = (f"const {BF}*", f"const {BF}*", "const float*", f"{BF}*", f"{BF}*", "int", "float*", "uint8_t*",
                "float*", "const int32_t*")
STORE_NORM_PARAMS = (f"const {BF}*", f"const {BF}*", f"const {BF}*", "float", *STORE_PARAMS[1:])
SELECT_PARAMS = ("const float*", "const float*", "const float*", "const uint8_t*", "const float*", "const int32_t*",
                 "const int32_t*", "float*", "uint32_t*", "uint32_t*", "unsigned long long*", "int32_t*")


def scratch_names(select_id: str) -> tuple[str, str, str, str]:
    """State buffers the select launch needs as scratch: scores, key histogram, arrival and
    listed-candidate counters, the candidate list (long contexts: kernels/dsa_index_select.cuh)."""
    return f"{select_id}.scores", f"{select_id}.hist", f"{select_id}.arrive", f"{select_id}.cand"


def lower(ctx: LowerCtx, group: LoweredGroup) -> list[Launch]:
    launches = []
    nodes = ctx.nodes(group)
    norm = next((n for n in nodes if n.op == "layer_norm"), None)
    for node in nodes:
        if node.op == "layer_norm":
            continue   # computed in the store's launch (rule dsa_key_store)
        if node.op == "kpool_compress":
            launches.append(_store(ctx, group, node, norm))
        elif node.op == "index_select":
            launches.append(_select(ctx, group, node))
        else:
            raise LoweringError(f"dsa_indexer has no kernel for {node.op}", f"node {node.id}")
    return launches


def store_instance(d: int, kp: int, fp8: bool, norm: bool = False) -> KernelInstance:
    """norm: the form that computes the key's LayerNorm in its block (rule dsa_key_store)."""
    if norm:
        return KernelInstance("dsa_indexer", "dsa_indexer.cuh",
                              f"kbp::dsa_indexer_store_norm<{d}, {kp}, {_cbool(fp8)}>", STORE_NORM_PARAMS)
    return KernelInstance("dsa_indexer", "dsa_indexer.cuh", f"kbp::dsa_indexer_store<{d}, {kp}, {_cbool(fp8)}>",
                          STORE_PARAMS)


def select_instance(heads: int, d: int, kp: int, topk_pools: int, fp8: bool, qrot: bool = False,
                    mma: bool = False, order_free: bool = False) -> KernelInstance:
    """qrot: score the fp8 codes against the rotated query; mma: score the f32 cache on BF16 tensor
    cores; order_free: no ranking while every valid pool is selected (each numerics `fast` only)."""
    if qrot and not fp8:
        raise ValueError("the rotated-query form scores the fp8 index cache")
    if mma and fp8:
        raise ValueError("the tensor-core form scores the f32 index cache")
    return KernelInstance("dsa_indexer", "dsa_indexer.cuh", f"kbp::dsa_index_select<{heads}, {d}, {kp}, "
                          f"{topk_pools}, {_cbool(fp8)}, {INDEX_SELECT_BIN_BITS}, {_cbool(qrot)}, {_cbool(mma)}, "
                          f"{_cbool(order_free)}>",
                          SELECT_PARAMS)


def select_blocks(target: str, capacity_pools: int) -> int:
    """One CTA per SM, but no more than the context's 32-pool chunks (each CTA scores whole chunks)."""
    return max(1, min(get_target(target).sms, -(-capacity_pools // SELECT_CHUNK)))


def _cbool(v: bool) -> str:
    return "true" if v else "false"


def _fp8(ctx: LowerCtx) -> bool:
    return ctx.plan.options.index_cache == "fp8"


def _rotated_query(ctx: LowerCtx) -> bool:
    """The select's fast form: fp8 cache and `fast` numerics (exact keeps the reference's read-back)."""
    return _fp8(ctx) and ctx.plan.options.numerics == "fast"


def _tensor_core_scores(ctx: LowerCtx) -> bool:
    """The select's fast form over the f32 cache: BF16 tensor-core scores (exact keeps the lane order)."""
    return not _fp8(ctx) and ctx.plan.options.numerics == "fast"


def _pool_args(ctx: LowerCtx, pool_node_id: str) -> tuple:
    """(pool_keys, pool_codes, pool_scales) of the index cache; the unused form's pointers NULL."""
    if _fp8(ctx):
        return (NULL, ctx.state(f"{pool_node_id}.pool_codes", "uint8_t"),
                ctx.state(f"{pool_node_id}.pool_scales", "float"))
    return ctx.state(f"{pool_node_id}.pool_keys", "float"), NULL, NULL


SMEM_LIMIT = 48 * 1024   # the select's static shared memory (DsaSelectSmem)


def select_smem_bytes(heads: int, d: int, fp8: bool, mma: bool) -> int:
    """sizeof(DsaSelectSmem) (kernels/dsa_index_select.cuh; what ptxas reports for the instance):
    phase 1's staging (CUDA-core forms: double-buffered raw rows and scales, the read-back keys,
    the head terms) or query fragments (MMA form) in a union with the 4096 rank keys, then the
    2^BITS-bin histogram, the warp sums and the block's counters, 16-byte aligned."""
    def up16(n: int) -> int:
        return -(-n // 16) * 16
    chunk, nt = SELECT_CHUNK, -(-heads // 8)
    if mma:
        phase1 = nt * (d // 16) * 32 * 8 + nt * 8 * 4
    else:
        phase1 = up16(up16(2 * chunk * d * (1 if fp8 else 4) + 2 * chunk * 4) + 4 * (chunk * d if fp8 else 1)
                      + chunk * (heads + 1) * 4)
    tail = (1 << INDEX_SELECT_BIN_BITS) * 4 + (SELECT_THREADS // 32) * 4 + 6 * 4 + 4
    return up16(up16(max(phase1, 4096 * 8)) + tail)


def check_select_sizes(heads: int, d: int, topk_pools: int, fp8: bool, where: str = "", mma: bool = False) -> None:
    """The sizes dsa_index_select takes (its static_asserts), as lowering errors."""
    if d % 32 or d > MAX_HEAD_DIM:
        raise LoweringError(f"index head width {d}: the select kernel takes a multiple of 32 up to "
                            f"{MAX_HEAD_DIM}", where)
    if fp8 and d & (d - 1):
        raise LoweringError(f"the fp8 index cache rotates a power-of-two width, not {d}", where)
    if not 1 <= heads <= MAX_HEADS or not 1 <= topk_pools <= SELECT_THREADS:
        raise LoweringError(f"{heads} index heads, top-{topk_pools} pools: the select kernel takes up to "
                            f"{MAX_HEADS} heads and {SELECT_THREADS} pools", where)
    need = select_smem_bytes(heads, d, fp8, mma)
    if need > SMEM_LIMIT:
        form = "tensor-core" if mma else "fp8" if fp8 else "f32"
        raise LoweringError(f"{heads} index heads of width {d}: the select kernel's {form} form needs about {need} "
                            f"bytes of shared memory, over its {SMEM_LIMIT}-byte limit (the CUDA-core forms stage "
                            "32 pools' keys and heads + 1 terms a pool)", where)


def _store(ctx: LowerCtx, group: LoweredGroup, node, norm=None) -> Launch:
    """The store; with `norm` (the key's layer_norm node, merged by rule dsa_key_store) the fused
    form, which reads the norm's input and weights instead of its output."""
    key, gate = ctx.input(node, op="layer_norm"), ctx.input(node, op="linear")
    one_row(ctx, node, key)
    d, kp = key.dim_value, ctx.sym["index_kpool"]
    if gate.dim_value != d:
        raise LoweringError(f"gate width {gate.dim_value} != key width {d}", f"node {node.id}")
    if d % 32 or d > 1024 or (_fp8(ctx) and d & (d - 1)):
        raise LoweringError(f"index key width {d}: one thread per channel in whole warps (a power of two "
                            "for the fp8 index cache)", f"node {node.id}")
    rows = state_buffer(ctx, f"{node.id}.tail_keys").shape[0]
    if rows % kp:
        raise LoweringError(f"tail rows {rows} are not whole pools of {kp}", f"node {node.id}")
    tail = (ctx.buf(gate), ctx.weight(node, "slot_bias", ctype="float"),
            ctx.state(f"{node.id}.tail_keys", BF), ctx.state(f"{node.id}.tail_gates", BF), lit(rows),
            *_pool_args(ctx, node.id), StepInput("POS"))
    if norm is None:
        return Launch(store_instance(d, kp, _fp8(ctx)), grid=(1, 1, 1), block=(d, 1, 1), smem=0,
                      args=(ctx.buf(key), *tail), group=group.id, nodes=(node.id,))
    x = ctx.input(norm)
    if block_threads(d) != d or x.dim_value != d:
        raise LoweringError(f"index key width {d}: the fused norm + store takes one thread a channel, a power of "
                            "two from 32 to 1024", f"node {node.id}")
    args = (ctx.buf(x), ctx.weight(norm, ctype=BF), ctx.weight(norm, "bias", BF), flt(ctx.c.layer_norm_eps), *tail)
    return Launch(store_instance(d, kp, _fp8(ctx), norm=True), grid=(1, 1, 1), block=(d, 1, 1), smem=0, args=args,
                  group=group.id, nodes=(norm.id, node.id))


def _select(ctx: LowerCtx, group: LoweredGroup, node) -> Launch:
    q, raw_w, sel = ctx.input(node, "iq"), ctx.input(node, "iw"), ctx.output(node)
    one_row(ctx, node, q)
    pool = block_node(ctx, node, "kpool_compress")
    heads, kp, topk = raw_w.dim_value, ctx.sym["index_kpool"], sel.dim_value   # the edge counts pools
    where = f"node {node.id}"
    if q.dim_value % heads:
        raise LoweringError(f"index queries ({q.dim_value}) are not {heads} whole heads", where)
    d = q.dim_value // heads
    check_select_sizes(heads, d, topk, _fp8(ctx), where, mma=_tensor_core_scores(ctx))
    if buffer_elements(ctx.bp, sel) != (topk + 1) * kp:
        raise LoweringError("selection buffer is not (top-k pools + 1) x K_P token ids", where)
    scores, hist, arrive, cand = scratch_names(node.id)
    capacity = state_buffer(ctx, scores).shape[0]
    if state_buffer(ctx, hist).shape[0] != 1 << INDEX_SELECT_BIN_BITS:
        raise LoweringError(f"histogram state {hist} does not have 2^{INDEX_SELECT_BIN_BITS} bins", where)
    if state_buffer(ctx, cand).nbytes != INDEX_SELECT_FILTER_CAP * 8:
        raise LoweringError(f"candidate list {cand} does not hold {INDEX_SELECT_FILTER_CAP} rank keys", where)
    blocks = select_blocks(ctx.plan.options.target, capacity)
    inst = select_instance(heads, d, kp, topk, _fp8(ctx), _rotated_query(ctx), _tensor_core_scores(ctx),
                           selection_is_a_set(ctx.bp, node, ctx.plan.options.numerics))
    args = (ctx.buf(q, "float"), ctx.buf(raw_w, "float"), *_pool_args(ctx, pool.id),
            StepInput("SEQ"), StepInput("POS"), ctx.state(scores, "float"), ctx.state(hist, "uint32_t"),
            ctx.state(arrive, "uint32_t"), ctx.state(cand, "unsigned long long"), ctx.buf(sel, "int32_t"))
    return Launch(inst, grid=(blocks, 1, 1), block=(SELECT_THREADS, 1, 1), smem=0, args=args, group=group.id,
                  nodes=(node.id,), note="scores + top-k + expansion")
