"""Benchmark cases of the DSA kernels at the seed's shapes (latent 512, 32 attention heads, indexer
32 heads x 128, pools of 4, top-2048 tokens) at 1k, 16k, 128k and 512k context, built through the
product's launchers (kbpc.testing.launchers) with the instances the lowerings emit: the indexer's
store, its fused select (scores + top-k + expansion) with the FP32 and the FP8 index cache (read
back through the rotation; the `fast` forms: the codes against the rotated query, the FP32 keys on
tensor cores), the split MLA decode, and a whole DSA layer's chain (latent write, store, select,
decode) with programmatic dependent launch, the number issue 14's targets are stated in. Pool keys
and latents are random (zeroed caches would make every score tie). See bench/kernels.py."""
from __future__ import annotations

import numpy as np

from kernels import Case, rotations

from kbpc.ir.state import INDEX_SELECT_FILTER_CAP

E, HEADS, D, H, KP, TOPK_POOLS, PAGE = 512, 32, 128, 32, 4, 512, 64
WIDTH = (TOPK_POOLS + 1) * KP
CONTEXTS = (1024, 16384, 131072, 524288)
BITS = 11


def _gpu(a):
    from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
    return to_gpu(a)


def _i32(v):
    return _gpu(np.array([v], np.int32))


def _launcher(inst):
    from kbpc.testing.launchers import launcher  # noqa: PLC0415
    return launcher(inst)


def _store(fp8: bool):
    from kbpc.codegen.families.dsa_indexer import store_instance  # noqa: PLC0415
    return _launcher(store_instance(D, KP, fp8))


def _select(fp8: bool, qrot: bool = False, mma: bool = False):
    from kbpc.codegen.families.dsa_indexer import select_instance  # noqa: PLC0415
    return _launcher(select_instance(H, D, KP, TOPK_POOLS, fp8, qrot=qrot, mma=mma))


def _decode():
    """(launcher, grid) of the split decode for the seed's heads."""
    from kbpc.codegen.families.glm_mla_decode import decode_instance, heads_per_cta  # noqa: PLC0415
    from kbpc.reference.glm_mla_decode import ORDER_WARPS  # noqa: PLC0415
    hpc = heads_per_cta(HEADS)
    return _launcher(decode_instance(E, hpc)), (ORDER_WARPS, HEADS // hpc, 1)


def _decode_fast():
    """(launcher, grid, split) of the CUDA-core `fast` decode for the seed's heads."""
    from kbpc.codegen.families.glm_mla_decode import fast_instance  # noqa: PLC0415
    from kbpc.reference.glm_mla_decode_fast import fast_split  # noqa: PLC0415
    from kbpc.targets import get_target  # noqa: PLC0415
    split = fast_split(HEADS, WIDTH, 1, get_target("sm_90").sms, E)
    return _launcher(fast_instance(E, split.hpc)), split.grid(HEADS, 1), split


def _latent_write():
    from kbpc.codegen.families.glm_mla_latent_write import PARAMS  # noqa: PLC0415
    from kbpc.codegen.records import KernelInstance  # noqa: PLC0415
    return _launcher(KernelInstance("glm_mla_latent_write", "glm_mla_latent_write.cuh",
                                    f"kbp::glm_mla_latent_write_fp8_paged<{E}>", PARAMS))


def _blocks(pools: int) -> int:
    from kbpc.codegen.families.dsa_indexer import select_blocks  # noqa: PLC0415
    return select_blocks("sm_90", pools)


def _pool_state(rng, pools: int, fp8: bool):
    """Device pool keys of one set: (pool_keys, pool_codes, pool_scales) with the unused form None."""
    keys = rng.normal(size=(pools, D)).astype(np.float32)
    if not fp8:
        return _gpu(keys), None, None
    from kbpc.reference.dsa_index_cache import quantize_pool_keys  # noqa: PLC0415
    codes, scales = quantize_pool_keys(keys)
    return None, _gpu(codes), _gpu(scales)


def _pool_bytes(pools: int, fp8: bool) -> int:
    return pools * (D + 4 if fp8 else D * 4)


class _Scratch:
    """The select's and the decode's scratch state (zeroed; the kernels leave it zeroed)."""

    def __init__(self, pools: int):
        self.scores = _gpu(np.zeros(pools, np.float32))
        self.hist = _gpu(np.zeros(1 << BITS, np.uint32))
        self.arrive = _gpu(np.zeros(2, np.uint32))
        self.cand = _gpu(np.zeros(INDEX_SELECT_FILTER_CAP, np.uint64))
        self.merge = _gpu(np.zeros((1, 32, HEADS, E + 2), np.float32))
        self.counters = _gpu(np.zeros((1, 16, HEADS), np.uint32))
        self.tokens = _gpu(np.zeros(WIDTH, np.int32))


def _store_case(fp8: bool) -> Case:
    nbytes = D * 2 * 2 * 2 + KP * D * (2 * 2 + 4) + _pool_bytes(1, fp8)   # write k,g; read pool rows, a; write key

    def setup():
        run, rng = _store(fp8), np.random.default_rng(0)
        k = _gpu(rng.integers(0, 1 << 14, D).astype(np.uint16))
        a = _gpu(np.zeros((KP, D), np.float32))
        kk, gg = _gpu(np.zeros((KP, D), np.uint16)), _gpu(np.zeros((KP, D), np.uint16))
        pk, codes, scales = _pool_state(rng, 8, fp8)
        tau = _i32(7)   # position 7 completes pool 1
        return lambda i: run((1, 1, 1), (D, 1, 1), k, k, a, kk, gg, KP, pk, codes, scales, tau, sync=False)
    kind = "fp8" if fp8 else "f32"
    return Case(f"dsa_indexer::store+pool ({kind})", f"{D} bf16 key+gate, pool {KP}", nbytes, setup)


def _select_case(ctx: int, fp8: bool, qrot: bool = False, mma: bool = False) -> Case:
    """qrot: the fp8 cache scored against the rotated query; mma: the f32 cache on tensor cores (the
    `fast` numerics forms)."""
    pools = ctx // KP
    nbytes = _pool_bytes(pools, fp8) + H * D * 4 + H * 4 + pools * 4 * 2 + WIDTH * 4

    def setup():
        run, rng = _select(fp8, qrot, mma), np.random.default_rng(0)
        n = rotations(_pool_bytes(pools, fp8), cap=16)
        sets = [_pool_state(rng, pools, fp8) for _ in range(n)]
        q, w = _gpu(rng.normal(size=(H, D)).astype(np.float32)), _gpu(rng.normal(size=H).astype(np.float32))
        sc, s, tau, blocks = _Scratch(pools), _i32(ctx), _i32(ctx - 1), _blocks(pools)
        return lambda i: run((blocks, 1, 1), (512, 1, 1), q, w, *sets[i % n], s, tau, sc.scores, sc.hist, sc.arrive,
                             sc.cand, sc.tokens, sync=False)
    form = ", rotated query" if qrot else ", tensor cores" if mma else ""
    kind = ("fp8" if fp8 else "f32") + " cache" + form
    return Case(f"dsa_indexer::select ({kind}) @{ctx}", f"ctx {ctx}: top {TOPK_POOLS} of {pools} pools", nbytes,
                setup)


def _latent_cache(rng, ctx: int):
    pages = -(-ctx // PAGE)
    return _gpu(rng.integers(0, 0x70, (pages * PAGE, E)).astype(np.uint8)), _gpu(rng.permutation(pages).astype(np.int32))


def _decode_inputs(rng, ctx: int, tokens: int, sort: bool):
    """A decode case's inputs: n rotated latent caches of ctx tokens, BF16 queries, a selection of
    `tokens` distinct ids (in id order with `sort`) then -1, the output and seq_len."""
    n = rotations(ctx * E, cap=8)
    caches = [_latent_cache(rng, ctx) for _ in range(n)]
    sel = np.full(WIDTH, -1, np.int32)
    ids = rng.choice(ctx, tokens, replace=False)
    sel[:tokens] = np.sort(ids) if sort else ids
    q = _gpu(rng.integers(0, 1 << 14, (HEADS, E)).astype(np.uint16))
    return n, caches, q, _gpu(sel), _gpu(np.zeros((HEADS, E), np.uint16)), _i32(ctx)


def _decode_case(ctx: int) -> Case:
    tokens = min(ctx, TOPK_POOLS * KP)
    nbytes = HEADS * E * 2 * 2 + tokens * E + WIDTH * 4

    def setup():
        (run, grid), rng = _decode(), np.random.default_rng(0)
        n, caches, q, d_sel, out, s = _decode_inputs(rng, ctx, tokens, sort=True)
        sc = _Scratch(1)
        return lambda i: run(grid, (256, 1, 1), q, caches[i % n][0], caches[i % n][1], PAGE, d_sel,
                             WIDTH, s, np.float32(1), out, sc.merge, sc.counters, sync=False)
    return Case("glm_mla_decode::decode_split", f"ctx {ctx}: {HEADS} heads x {tokens} tokens", nbytes, setup)


def _decode_fast_case(ctx: int) -> Case:
    """The `fast` numerics form of the decode (slices x head groups, one flat merge)."""
    tokens = min(ctx, TOPK_POOLS * KP)
    nbytes = HEADS * E * 2 * 2 + tokens * E + WIDTH * 4

    def setup():
        run, grid, split = _decode_fast()
        n, caches, q, d_sel, out, s = _decode_inputs(np.random.default_rng(0), ctx, tokens, sort=False)
        partials = _gpu(np.zeros((1, split.slices, HEADS, E + 4), np.float32))
        counters = _gpu(np.zeros((1, HEADS // split.hpc), np.uint32))
        return lambda i: run(grid, (256, 1, 1), q, caches[i % n][0], caches[i % n][1], PAGE, d_sel, WIDTH, s,
                             np.float32(1), split.chunk, out, partials, counters, smem=split.smem_bytes(E),
                             sync=False)
    return Case(f"glm_mla_decode::decode_fast @{ctx}", f"ctx {ctx}: {HEADS} heads x {tokens} tokens", nbytes, setup)


def _layer_case(ctx: int, fp8: bool) -> Case:
    """latent write + index store + select + decode, back to back with PDL: one DSA layer's kernels
    (the projections aside). The position completes a pool, so the store writes a pool key."""
    pools, tokens = ctx // KP, min(ctx, TOPK_POOLS * KP)
    nbytes = (_pool_bytes(pools, fp8) + pools * 8 + tokens * E + HEADS * E * 4 + H * D * 4 + E * 3
              + KP * D * 8 + WIDTH * 8)

    def setup():
        write, store, select, (decode, grid) = _latent_write(), _store(fp8), _select(fp8), _decode()
        rng = np.random.default_rng(0)
        n = rotations(_pool_bytes(pools, fp8) + ctx * E, cap=8)
        sets = [(_pool_state(rng, pools, fp8), _latent_cache(rng, ctx)) for _ in range(n)]
        c = _gpu(rng.integers(0, 1 << 14, E).astype(np.uint16))
        gamma = _gpu(np.full(E, 0x3F80, np.uint16))
        k = _gpu(rng.integers(0, 1 << 14, D).astype(np.uint16))
        a = _gpu(np.zeros((KP, D), np.float32))
        kk, gg = _gpu(np.zeros((KP, D), np.uint16)), _gpu(np.zeros((KP, D), np.uint16))
        q, w = _gpu(rng.normal(size=(H, D)).astype(np.float32)), _gpu(rng.normal(size=H).astype(np.float32))
        qa = _gpu(rng.integers(0, 1 << 14, (HEADS, E)).astype(np.uint16))
        out, sc, blocks = _gpu(np.zeros((HEADS, E), np.uint16)), _Scratch(pools), _blocks(pools)
        pos, seq = _i32(ctx - 1), _i32(ctx)

        def launch(i):
            (pk, codes, scales), (cache, table) = sets[i % n]
            write((1, 1, 1), (E, 1, 1), c, gamma, table, PAGE, pos, np.float32(1), np.float32(1e-5), cache,
                  pdl=True, sync=False)
            store((1, 1, 1), (D, 1, 1), k, k, a, kk, gg, KP, pk, codes, scales, pos, pdl=True, sync=False)
            select((blocks, 1, 1), (512, 1, 1), q, w, pk, codes, scales, seq, pos, sc.scores, sc.hist, sc.arrive,
                   sc.cand, sc.tokens, pdl=True, sync=False)
            decode(grid, (256, 1, 1), qa, cache, table, PAGE, sc.tokens, WIDTH, seq, np.float32(1),
                   out, sc.merge, sc.counters, pdl=True, sync=False)
        return launch
    kind = "fp8" if fp8 else "f32"
    return Case(f"dsa layer: write+store+select+decode ({kind})", f"ctx {ctx}, PDL", nbytes, setup)


CASES = [_store_case(False), _store_case(True)] + [
    make(ctx) for ctx in CONTEXTS for make in (
        lambda c: _select_case(c, False), lambda c: _select_case(c, False, mma=True), lambda c: _select_case(c, True),
        lambda c: _select_case(c, True, qrot=True), _decode_case,
        _decode_fast_case,
        lambda c: _layer_case(c, False), lambda c: _layer_case(c, True))]
