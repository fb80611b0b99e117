// dsa_index_score_mma.cuh: phase 1 of dsa_index_select (dsa_index_select.cuh) on tensor cores, the
// select's form for numerics `fast` with the FP32 index cache (template flag MMA): the pool scores
// as BF16 mma.sync m16n8k16 with FP32 accumulation, the precision point the dsa_indexer explain
// names for its tensor-core score path (queries and pool keys rounded to BF16, RNE).
// Launch contract: none (device functions of dsa_index_select; sm_80+).
//
// Why: the exact form spends ~12 instructions per (pool, head, 4 channels) on unfused FP32
// products, lane partials and the transposed butterfly, so at 128k context (32768 pools) its
// scoring runs at ~1 ns a pool over the whole GPU; a 16-pool tile on tensor cores is 2 D/16 x H/8
// mma plus its loads, and the scoring becomes a stream of the pool keys.
//
// Work. The CTA converts the queries once into B fragments in shared memory (qfrag, below) and the
// head weights w_h = fl(raw_h * fl(1/sqrtf(H))). Each warp takes 16-pool tiles of the CTA's pool
// range: lane (g, c) = (lane / 4, lane % 4) loads pools g and g + 8 of the tile as float4s of
// channels 16 s + 4 c .. + 3 (s < D / 16), the tile's A fragments. An mma's k order is free (a dot
// product is a sum), so its logical columns 2c, 2c+1, 2c+8, 2c+9 carry channels 16 s + 4c + 0..3,
// in A and in B alike: each lane's operands are one float4 per row and k step, no shuffles. Per
// group of 8 heads the accumulators hold x = q . k for (pool g | g + 8, head 2c | 2c + 1); the lane
// adds w_h relu(x fl(1/sqrtf(D))) of its two heads by FMA, the quad sums its lanes (xor 1, then 2),
// and lane c = 0 writes the two pools' scores and their histogram digits. The order is fixed, so a
// launch's scores do not depend on timing; the bound against the reference is
// kbpc/reference/dsa_indexer.py bf16_score_bound. Heads past H (H not a multiple of 8) are zero
// queries with zero weights: their terms are +0.
#pragma once

#include "dsa_indexer_common.cuh"

namespace kbp {

template <int H, int D>
struct DsaSelectMmaSmem {
    static constexpr int NT = (H + 7) / 8, S = D / 16;
    uint2 qfrag[NT * S * 32];   // (n tile t, k step s, lane l): bf16x2 of q[8t + l/4][16s + 4(l%4) + {0,1 | 2,3}]
    float w[NT * 8];            // head weights, 0 past H
};

__device__ __forceinline__ uint32_t dsa_bf16x2(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ void dsa_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint2 b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}

// The queries' B fragments and the head weights into shared memory (after pdl_wait: step data).
// Called by every thread of the block; the caller's barrier publishes them.
template <int H, int D, int T>
__device__ __forceinline__ void dsa_mma_stage_queries(DsaSelectMmaSmem<H, D>& sm, const float* q, const float* raw_w) {
    using Sm = DsaSelectMmaSmem<H, D>;
    const float inv_sqrt_h = 1.0f / sqrtf((float)H);
    for (int e = threadIdx.x; e < Sm::NT * Sm::S * 32; e += T) {
        const int l = e & 31, s = (e >> 5) % Sm::S, t = (e >> 5) / Sm::S, h = 8 * t + (l >> 2);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (h < H) v = ld_step(reinterpret_cast<const float4*>(q + h * D + 16 * s + 4 * (l & 3)));
        sm.qfrag[e] = make_uint2(dsa_bf16x2(v.x, v.y), dsa_bf16x2(v.z, v.w));
    }
    for (int h = threadIdx.x; h < Sm::NT * 8; h += T) sm.w[h] = h < H ? ld_step(raw_w + h) * inv_sqrt_h : 0.0f;
}

// Score pools [begin, end) (16-pool tiles, warp w of NW taking tiles w, w + NW, ...) into scores
// and add their first BITS key bits to the block's histogram. pool_keys float [..][D], 16-byte
// aligned rows (D a multiple of 16).
template <int H, int D, int BITS, int NW>
__device__ __forceinline__ void dsa_mma_score_tiles(const DsaSelectMmaSmem<H, D>& sm, const float* pool_keys, int begin,
                                                    int end, float* scores, uint32_t* hist) {
    using Sm = DsaSelectMmaSmem<H, D>;
    constexpr int S = Sm::S;
    static_assert(D % 16 == 0, "16-channel k steps");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    const int tiles = (end - begin + 15) / 16;
    for (int tile = warp; tile < tiles; tile += NW) {
        const int pa = begin + 16 * tile + g, pb = pa + 8;
        uint32_t a[S][4];
        {
            float4 ka[S], kb[S];
            const float4* ra = reinterpret_cast<const float4*>(pool_keys + (size_t)pa * D) + c;
            const float4* rb = reinterpret_cast<const float4*>(pool_keys + (size_t)pb * D) + c;
            const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int s = 0; s < S; ++s) {   // all loads in flight before the first conversion
                ka[s] = pa < end ? __ldcg(ra + 4 * s) : zero;
                kb[s] = pb < end ? __ldcg(rb + 4 * s) : zero;
            }
#pragma unroll
            for (int s = 0; s < S; ++s) {
                a[s][0] = dsa_bf16x2(ka[s].x, ka[s].y);   // row g, k 2c, 2c+1
                a[s][1] = dsa_bf16x2(kb[s].x, kb[s].y);   // row g+8
                a[s][2] = dsa_bf16x2(ka[s].z, ka[s].w);   // row g, k 2c+8, 2c+9
                a[s][3] = dsa_bf16x2(kb[s].z, kb[s].w);   // row g+8
            }
        }
        float sa = 0.0f, sb = 0.0f;
#pragma unroll 2
        for (int t = 0; t < Sm::NT; ++t) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s = 0; s < S; ++s) dsa_mma_bf16(acc, a[s], sm.qfrag[(t * S + s) * 32 + lane]);
            const float w0 = sm.w[8 * t + 2 * c], w1 = sm.w[8 * t + 2 * c + 1];
            sa = __fmaf_rn(w0, fmaxf(__fmul_rn(acc[0], inv_sqrt_d), 0.0f), sa);
            sa = __fmaf_rn(w1, fmaxf(__fmul_rn(acc[1], inv_sqrt_d), 0.0f), sa);
            sb = __fmaf_rn(w0, fmaxf(__fmul_rn(acc[2], inv_sqrt_d), 0.0f), sb);
            sb = __fmaf_rn(w1, fmaxf(__fmul_rn(acc[3], inv_sqrt_d), 0.0f), sb);
        }
        sa = sa + __shfl_xor_sync(0xffffffffu, sa, 1);
        sb = sb + __shfl_xor_sync(0xffffffffu, sb, 1);
        sa = sa + __shfl_xor_sync(0xffffffffu, sa, 2);
        sb = sb + __shfl_xor_sync(0xffffffffu, sb, 2);
        if (c == 0 && pa < end) {
            scores[pa] = sa;
            dsa_hist_add(hist, dsa_score_key(sa) >> (32 - BITS));
        }
        if (c == 0 && pb < end) {
            scores[pb] = sb;
            dsa_hist_add(hist, dsa_score_key(sb) >> (32 - BITS));
        }
    }
}

}  // namespace kbp
