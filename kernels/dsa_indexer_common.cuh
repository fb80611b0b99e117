// dsa_indexer_common.cuh: device helpers of the DSA lightning indexer (dsa_indexer.cuh, the
// family header, documents the kernels and the math): geometry, the order-preserving score key,
// the transposed warp reduction, the Walsh-Hadamard rotation of the FP8 pool-key cache, and the
// expansion of selected pools into token ids.
// Launch contract: none (inline device functions only). Self-contained.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

// Number of valid pools and of pools to select, from the device geometry.
__device__ __forceinline__ int dsa_valid_pools(int seq_len, int tau, int kp) {
    return min(seq_len / kp, (tau + 1) / kp);
}
__device__ __forceinline__ int dsa_topk_count(int seq_len, int tau, int kp, int topk_pools) {
    return min((tau + 1) / kp, min(seq_len, topk_pools * kp) / kp);
}
// Whether the top k is every valid pool (whatever the scores): where an unranked select
// (ORDER_FREE) lists them without scoring (kbpc.reference.dsa_indexer.every_pool_selected).
__device__ __forceinline__ bool dsa_every_pool_selected(int seq_len, int tau, int kp, int topk_pools) {
    return dsa_topk_count(seq_len, tau, kp, topk_pools) == dsa_valid_pools(seq_len, tau, kp);
}

// Order-preserving unsigned key of a score (larger key = larger score); -0 is mapped to +0.
__device__ __forceinline__ uint32_t dsa_score_key(float s) {
    const uint32_t b = __float_as_uint(s == 0.0f ? 0.0f : s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The total order of the selection as one 64-bit value: key descending, then the lower pool
// index (a larger complement). Never 0 (the key of -inf is 0x007fffff), so 0 pads sort last.
__device__ __forceinline__ unsigned long long dsa_rank_key(float s, int idx) {
    return ((unsigned long long)dsa_score_key(s) << 32) | (0xffffffffu - (uint32_t)idx);
}
__device__ __forceinline__ int32_t dsa_rank_index(unsigned long long r) {
    return (int32_t)(0xffffffffu - (uint32_t)(r & 0xffffffffull));
}

// Reduce N per-lane partials (N a power of two <= 32) so that lane l ends with the total of slot
// l / (32 / N). At each halving step a lane keeps half its slots and receives the partner's
// partials of them; the pairs are those of the xor butterfly (and of fp32.tree_sum: lane l with
// l ^ off, off = 16, 8, ..., 1), so every slot's total has the butterfly's bits.
template <int W, int OFF, int N>
__device__ __forceinline__ void transpose_step(float (&v)[N], int lane) {
    if constexpr (OFF >= 1) {
        if constexpr (W >= 2) {   // W slots held: keep half, receive the partner's partials of them
            const bool upper = (lane & OFF) != 0;
#pragma unroll
            for (int i = 0; i < W / 2; ++i) {
                const float send = upper ? v[i] : v[i + W / 2];
                const float keep = upper ? v[i + W / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
            }
            transpose_step<W / 2, OFF / 2, N>(v, lane);
        } else {
            v[0] = v[0] + __shfl_xor_sync(0xffffffffu, v[0], OFF);
            transpose_step<1, OFF / 2, N>(v, lane);
        }
    }
}
template <int N>
__device__ __forceinline__ float transpose_reduce(float (&v)[N], int lane) {
    static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N slots, a power of two");
    transpose_step<N, 16, N>(v, lane);
    return v[0];
}
__device__ __forceinline__ float transpose_reduce32(float (&v)[32], int lane) { return transpose_reduce<32>(v, lane); }

// Unnormalised Walsh-Hadamard transform of D = 32 J values held by one warp as v[j] = x[lane + 32 j]:
// stages h = 1, 2, ..., D/2 in increasing order (h < 32 across lanes, h >= 32 across registers);
// the pair (i, i + h) with bit h of i clear becomes (x_i + x_{i+h}, x_i - x_{i+h}).
template <int J>
__device__ __forceinline__ void dsa_fwht_warp(float (&v)[J], int lane) {
    static_assert(J >= 1 && (J & (J - 1)) == 0, "a power-of-two width");
#pragma unroll
    for (int h = 1; h < 32; h <<= 1) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const float o = __shfl_xor_sync(0xffffffffu, v[j], h);
            v[j] = (lane & h) ? o - v[j] : v[j] + o;
        }
    }
#pragma unroll
    for (int hj = 1; hj < J; hj <<= 1) {
#pragma unroll
        for (int j = 0; j < J; ++j) {
            if ((j & hj) == 0) {
                const float a = v[j], b = v[j + hj];
                v[j] = a + b;
                v[j + hj] = a - b;
            }
        }
    }
}

// The pool's power-of-two scale sigma = 2^e, e the smallest integer with max_abs <= 448 * 2^e
// (exact arithmetic), clamped to [-126, 127]; e = -126 for an all-zero key. frexpf is exact.
__device__ __forceinline__ float dsa_pool_scale(float max_abs) {
    int e = -126;
    if (max_abs > 0.0f) {
        int ex;
        const float f = frexpf(max_abs, &ex);
        e = f <= 0.875f ? ex - 9 : ex - 8;
        e = max(-126, min(127, e));
    }
    return __int_as_float((e + 127) << 23);
}

// Token list from rank-ordered pools (k of them): pools' tokens, the tail pool's visible tokens,
// then -1, over the whole width (TOPK_POOLS + 1) * KP. Called by every thread of a block.
template <int KP, int TOPK_POOLS, typename PoolAt>
__device__ __forceinline__ void dsa_expand(PoolAt pool_at, int k, int seq_len, int tau,
                                           int32_t* sel_tokens) {
    constexpr int W = (TOPK_POOLS + 1) * KP;
    const int n_vis = min(seq_len, tau + 1);
    const int tail_start = (n_vis / KP) * KP, tail = n_vis % KP;
    for (int e = threadIdx.x; e < W; e += blockDim.x) {
        const int r = e / KP;
        int32_t tok;
        if (r < k) {
            tok = pool_at(r) * KP + (e - r * KP);
        } else {
            const int t = e - k * KP;
            tok = t < tail ? tail_start + t : -1;
        }
        sel_tokens[e] = tok;
    }
}

// Warp-aggregated shared-memory atomics (many lanes hit the same word in the selection's passes):
// a slot of an append counter for each calling lane, and a histogram increment.
__device__ __forceinline__ uint32_t dsa_append_slot(uint32_t* count) {
    const unsigned active = __activemask();
    const int lane = threadIdx.x & 31, leader = __ffs(active) - 1;
    uint32_t base = 0;
    if (lane == leader) base = atomicAdd(count, (uint32_t)__popc(active));
    base = __shfl_sync(active, base, leader);
    return base + (uint32_t)__popc(active & ((1u << lane) - 1u));
}
__device__ __forceinline__ void dsa_hist_add(uint32_t* h, uint32_t bin) {
    const unsigned active = __activemask();
    const unsigned peers = __match_any_sync(active, bin);
    if ((peers & ((1u << (threadIdx.x & 31)) - 1u)) == 0) atomicAdd(&h[bin], (uint32_t)__popc(peers));
}

__host__ __device__ constexpr int dsa_pow2_at_least(int n) { return n <= 1 ? 1 : 2 * dsa_pow2_at_least((n + 1) / 2); }

// (cp_async16 / cp_async_commit / cp_async_wait: kbp_common.cuh)

// Double-buffered staging, at the top of chunk c's step: issue chunk c + 1 (stage(c) issues one
// chunk's copies and commits one group), wait until chunk c has landed, then a block barrier.
template <typename Stage>
__device__ __forceinline__ void cp_async_step(Stage stage, int c, int chunks) {
    if (c + 1 < chunks) {
        stage(c + 1);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

}  // namespace kbp
