// dsa_indexer.cuh: the DSA lightning indexer for one decode row: key store + pool compression,
// scores over the persisted pool keys for all index heads, a deterministic top-k, expansion.
//
// Geometry lives on the device (graph-replay safe): seq_len[0] = S (tokens cached, this step's
// token included), tau[0] = the query position. Pools p < n_valid = min(S/KP, (tau+1)/KP) are
// scored; k = min((tau+1)/KP, min(S, TOPK_POOLS*KP)/KP) of them are selected.
//
// Device state (owned by the runner; reference: kbpc/reference/dsa_indexer.py):
//   kg_keys, kg_gates  __nv_bfloat16 [rows][D]  token t in row t % rows (rows a multiple of KP;
//                                              rows = KP keeps only the incomplete pool)
//   pool_keys          float [pool_capacity][D] kbar_p, written when pool p completes
//   scores             float [pool_capacity]    scratch; entries [0, n_valid) are written
//   sel_pools          int32 [TOPK_POOLS]       rank-ordered pool ids, -1 padded
//   sel_tokens         int32 [(TOPK_POOLS + 1) * KP]  the pools' tokens in rank order, the
//                                              visible tokens of the tail pool, then -1
//
// Kernels and launch contracts
//   dsa_indexer_store<D, KP><<<1, D>>>(key, gate, slot_term, kg_keys, kg_gates, rows, pool_keys, tau)
//     key, gate: bf16 [D] (normalised index key, gate); slot_term: float [KP][D] (the learned a).
//     Stores token tau; if tau + 1 is a multiple of KP also writes pool_keys[tau / KP].
//   dsa_index_scores<H, D, KP><<<any grid, 128>>>(q, raw_w, pool_keys, seq_len, tau, scores)
//     q: float [H][D]; raw_w: float [H] = (W_w x)_h (H^{-1/2} is applied here). A warp scores 32
//     pools per step, grid-striding: any grid is correct; ceil(n_valid / 128) blocks is enough.
//     Any H with H * D / 32 <= 128 (heads are taken 32 at a time; a last partial group is padded
//     with zero partials, which leaves the real heads' sums unchanged).
//   dsa_topk_select<KP, TOPK_POOLS><<<1, 1024>>>(scores, seq_len, tau, sel_pools, sel_tokens)
//   dsa_expand_selection<KP, TOPK_POOLS><<<1, 256>>>(sel_pools, seq_len, tau, sel_tokens)
//     (expansion alone, for a selection made elsewhere; dsa_topk_select already expands).
//
// Math and order (explain.families.dsa_indexer; every choice matches the reference):
//   pool softmax per channel: x_s = g_s + a_s, m = max_s x_s, e_s = __expf(x_s - m),
//     den = e_0 + e_1 + ..., kbar = sum_s fl(e_s / den) k_s in slot order;
//   score: lane l sums q[c] kbar[c] for c = l, l+32, ... sequentially, a 32-lane tree
//     (a transposed butterfly: 31 shuffles for 32 heads, same pairs as the xor butterfly),
//     relu(fl(dot * fl(1/sqrtf(D)))) (+0 for x <= 0), times w_h = fl(raw_h * fl(1/sqrtf(H))),
//     summed in head order from +0;
//   top-k: score descending, ties to the lower pool index, -0 == +0 (radix select on the
//     order-preserving key, ties at the threshold taken in index order, then a bitonic sort).
// Each kernel NAME is a thin __global__ over NAME_body (a __device__ function), so a translation
// unit may wrap the body in an extern "C" kernel with the same launch bounds.
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

template <int D, int KP>
__device__ __forceinline__ void dsa_indexer_store_body(
    const __nv_bfloat16* __restrict__ key, const __nv_bfloat16* __restrict__ gate,
    const float* __restrict__ slot_term, __nv_bfloat16* __restrict__ kg_keys,
    __nv_bfloat16* __restrict__ kg_gates, int rows, float* __restrict__ pool_keys,
    const int32_t* __restrict__ tau_ptr) {
    static_assert(D <= 1024 && KP >= 1, "one thread per channel");
    const int c = threadIdx.x;
    const int t = tau_ptr[0];
    const __nv_bfloat16 k_new = key[c], g_new = gate[c];
    kg_keys[(size_t)(t % rows) * D + c] = k_new;
    kg_gates[(size_t)(t % rows) * D + c] = g_new;
    if ((t + 1) % KP != 0) return;
    // Each thread re-reads only its own channel (earlier launches wrote it): no block sync.
    const int p = t / KP;
    float k[KP], x[KP];
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        const size_t r = (size_t)((p * KP + s) % rows) * D + c;
        const bool last = s == KP - 1;
        k[s] = bf16_to_f32(last ? k_new : kg_keys[r]);
        x[s] = bf16_to_f32(last ? g_new : kg_gates[r]) + slot_term[s * D + c];
    }
    float m = x[0];
#pragma unroll
    for (int s = 1; s < KP; ++s) m = fmaxf(m, x[s]);
    float e[KP], den = 0.0f;
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        e[s] = kbp::exp_f32(x[s] - m);
        den = s == 0 ? e[0] : den + e[s];
    }
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < KP; ++s) {
        const float term = (e[s] / den) * k[s];
        acc = s == 0 ? term : acc + term;
    }
    pool_keys[(size_t)p * D + c] = acc;
}

template <int D, int KP>
__global__ void __launch_bounds__(D) dsa_indexer_store(
    const __nv_bfloat16* __restrict__ key, const __nv_bfloat16* __restrict__ gate,
    const float* __restrict__ slot_term, __nv_bfloat16* __restrict__ kg_keys,
    __nv_bfloat16* __restrict__ kg_gates, int rows, float* __restrict__ pool_keys,
    const int32_t* __restrict__ tau_ptr) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    dsa_indexer_store_body<D, KP>(key, gate, slot_term, kg_keys, kg_gates, rows, pool_keys, tau_ptr);
}

// Reduce 32 per-lane partials (one per head) so lane l ends with head l's total. At each step a
// lane keeps half its heads and receives the partner's partials of them: the pairs are those of
// the xor butterfly (and of fp32.tree_sum), with 31 shuffles instead of 5 per head.
__device__ __forceinline__ float transpose_reduce32(float (&v)[32], int lane) {
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        const bool upper = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < off; ++i) {
            const float send = upper ? v[i] : v[i + off];
            const float keep = upper ? v[i + off] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
    return v[0];
}

constexpr int DSA_SCORE_WARPS = 4;

template <int H, int D, int KP>
__device__ __forceinline__ void dsa_index_scores_body(
    const float* __restrict__ q, const float* __restrict__ raw_w, const float* __restrict__ pool_keys,
    const int32_t* __restrict__ seq_len, const int32_t* __restrict__ tau, float* __restrict__ scores) {
    static_assert(D % 32 == 0, "lane-strided channels");
    constexpr int J = D / 32, HG = (H + 31) / 32;
    static_assert(H * J <= 128, "queries are held in registers");
    __shared__ float terms[DSA_SCORE_WARPS][32][H + 1];
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int n_valid = dsa_valid_pools(seq_len[0], tau[0], KP);
    float qr[H][J];
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
        for (int j = 0; j < J; ++j) qr[h][j] = q[h * D + lane + 32 * j];
    const float inv_sqrt_h = 1.0f / sqrtf((float)H), inv_sqrt_d = 1.0f / sqrtf((float)D);
    float w[HG];
#pragma unroll
    for (int g = 0; g < HG; ++g) w[g] = 32 * g + lane < H ? raw_w[32 * g + lane] * inv_sqrt_h : 0.0f;

    const int nwarps = gridDim.x * DSA_SCORE_WARPS;
    for (int base = (blockIdx.x * DSA_SCORE_WARPS + wib) * 32; base < n_valid; base += nwarps * 32) {
        const int count = min(32, n_valid - base);
        float kn[J];
#pragma unroll
        for (int j = 0; j < J; ++j) kn[j] = pool_keys[(size_t)base * D + lane + 32 * j];
        for (int pp = 0; pp < count; ++pp) {
            float k[J];
#pragma unroll
            for (int j = 0; j < J; ++j) k[j] = kn[j];
            if (pp + 1 < count) {  // prefetch the next pool's key
#pragma unroll
                for (int j = 0; j < J; ++j) kn[j] = pool_keys[(size_t)(base + pp + 1) * D + lane + 32 * j];
            }
#pragma unroll
            for (int g = 0; g < HG; ++g) {
                float part[32];
#pragma unroll
                for (int hh = 0; hh < 32; ++hh) {
                    const int h = 32 * g + hh < H ? 32 * g + hh : H - 1;  // in bounds; unused if padded
                    float acc = qr[h][0] * k[0];
#pragma unroll
                    for (int j = 1; j < J; ++j) acc = acc + qr[h][j] * k[j];
                    part[hh] = 32 * g + hh < H ? acc : 0.0f;
                }
                const float x = transpose_reduce32(part, lane) * inv_sqrt_d;
                if (32 * g + lane < H) terms[wib][pp][32 * g + lane] = w[g] * (x > 0.0f ? x : 0.0f);
            }
        }
        __syncwarp();
        if (lane < count) {
            float acc = 0.0f;
#pragma unroll
            for (int h = 0; h < H; ++h) acc = acc + terms[wib][lane][h];
            scores[base + lane] = acc;
        }
        __syncwarp();
    }
}

template <int H, int D, int KP>
__global__ void __launch_bounds__(32 * DSA_SCORE_WARPS) dsa_index_scores(
    const float* __restrict__ q, const float* __restrict__ raw_w, const float* __restrict__ pool_keys,
    const int32_t* __restrict__ seq_len, const int32_t* __restrict__ tau, float* __restrict__ scores) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    dsa_index_scores_body<H, D, KP>(q, raw_w, pool_keys, seq_len, tau, scores);
}

// Order-preserving unsigned key of a score (larger key = larger score); -0 is mapped to +0.
__device__ __forceinline__ uint32_t dsa_score_key(float s) {
    const uint32_t b = __float_as_uint(s == 0.0f ? 0.0f : s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Token list from rank-ordered pools (k of them): pools' tokens, the tail pool's visible tokens,
// then -1, over the whole width (TOPK_POOLS + 1) * KP. Called by every thread of a block.
template <int KP, int TOPK_POOLS, typename PoolAt>
__device__ __forceinline__ void dsa_expand(PoolAt pool_at, int k, int seq_len, int tau,
                                           int32_t* __restrict__ sel_tokens) {
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

template <int KP, int TOPK_POOLS>
__device__ __forceinline__ void dsa_expand_selection_body(
    const int32_t* __restrict__ sel_pools, const int32_t* __restrict__ seq_len,
    const int32_t* __restrict__ tau, int32_t* __restrict__ sel_tokens) {
    const int s = seq_len[0], t = tau[0];
    const int k = dsa_topk_count(s, t, KP, TOPK_POOLS);
    dsa_expand<KP, TOPK_POOLS>([&](int r) { return sel_pools[r]; }, k, s, t, sel_tokens);
}

template <int KP, int TOPK_POOLS>
__global__ void __launch_bounds__(256) dsa_expand_selection(
    const int32_t* __restrict__ sel_pools, const int32_t* __restrict__ seq_len,
    const int32_t* __restrict__ tau, int32_t* __restrict__ sel_tokens) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    dsa_expand_selection_body<KP, TOPK_POOLS>(sel_pools, seq_len, tau, sel_tokens);
}

__host__ __device__ constexpr int dsa_pow2_at_least(int n) { return n <= 1 ? 1 : 2 * dsa_pow2_at_least((n + 1) / 2); }
constexpr int DSA_TOPK_THREADS = 1024;

// Radix select (four 8-bit digits, most significant first) of the k-th largest key among the
// first n scores: returns the key T and how many keys equal to T are selected (1..count(T)).
__device__ __forceinline__ void dsa_radix_threshold(const float* __restrict__ scores, int n, int k,
                                                    uint32_t* hist, uint32_t* shared2,
                                                    uint32_t& thr, int& take_eq) {
    const int tid = threadIdx.x, lane = tid & 31;
    uint32_t prefix = 0, mask = 0;
    int kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) {
            const uint32_t u = dsa_score_key(scores[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid < 32) {  // lane j owns digits 8j .. 8j+7; a suffix scan finds the k-th digit
            uint32_t local = 0;
#pragma unroll
            for (int b = 0; b < 8; ++b) local += hist[8 * lane + b];
            uint32_t incl = local;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const uint32_t t = __shfl_down_sync(0xffffffffu, incl, off);
                if (lane + off < 32) incl += t;
            }
            uint32_t above = incl - local;  // keys with a larger digit
            if (above < (uint32_t)kk && (uint32_t)kk <= incl) {
                for (int b = 7; b >= 0; --b) {
                    const uint32_t h = hist[8 * lane + b];
                    if (above + h >= (uint32_t)kk) {
                        shared2[0] = prefix | ((uint32_t)(8 * lane + b) << shift);
                        shared2[1] = (uint32_t)kk - above;
                        break;
                    }
                    above += h;
                }
            }
        }
        __syncthreads();
        prefix = shared2[0];
        kk = (int)shared2[1];
        mask |= 255u << shift;
    }
    thr = prefix;
    take_eq = kk;
}

// Gather the k selected (key, index) pairs as 64-bit sort keys: keys above T in any order, keys
// equal to T in index order (a chunked block scan), the first take_eq of them.
__device__ __forceinline__ void dsa_collect(const float* __restrict__ scores, int n, uint32_t thr,
                                            int take_eq, int k, unsigned long long* cand,
                                            uint32_t* counter, uint32_t* warp_tot) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int n_gt = k - take_eq;
    int eq_base = 0;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + tid;
        const uint32_t u = i < n ? dsa_score_key(scores[i]) : 0u;
        const bool gt = i < n && u > thr, eq = i < n && u == thr;
        const unsigned long long sk = ((unsigned long long)u << 32) | (0xffffffffu - (uint32_t)i);
        if (gt) cand[atomicAdd(counter, 1u)] = sk;
        const uint32_t ball = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_tot[warp] = __popc(ball);
        __syncthreads();
        int off = eq_base, total = 0;
        for (int w = 0; w < nw; ++w) {
            const int c = (int)warp_tot[w];
            if (w < warp) off += c;
            total += c;
        }
        const int rank = off + __popc(ball & ((1u << lane) - 1u));
        if (eq && rank < take_eq) cand[n_gt + rank] = sk;
        __syncthreads();
        eq_base += total;
    }
}

template <int KP, int TOPK_POOLS>
__device__ __forceinline__ void dsa_topk_select_body(
    const float* __restrict__ scores, const int32_t* __restrict__ seq_len, const int32_t* __restrict__ tau,
    int32_t* __restrict__ sel_pools, int32_t* __restrict__ sel_tokens) {
    constexpr int N = dsa_pow2_at_least(TOPK_POOLS);
    __shared__ unsigned long long cand[N];
    __shared__ uint32_t hist[256], shared2[2], counter[1], warp_tot[DSA_TOPK_THREADS / 32];
    const int tid = threadIdx.x;
    const int s = seq_len[0], t = tau[0];
    const int n = dsa_valid_pools(s, t, KP), k = dsa_topk_count(s, t, KP, TOPK_POOLS);
    for (int i = tid; i < N; i += blockDim.x) cand[i] = 0ull;  // padding sorts last
    if (tid == 0) counter[0] = 0;
    __syncthreads();
    if (k > 0) {
        uint32_t thr;
        int take_eq;
        dsa_radix_threshold(scores, n, k, hist, shared2, thr, take_eq);
        dsa_collect(scores, n, thr, take_eq, k, cand, counter, warp_tot);
        __syncthreads();
        // Bitonic sort, descending: larger key first, then the lower index (larger ~index).
        for (int size = 2; size <= N; size <<= 1) {
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = tid; i < N; i += blockDim.x) {
                    const int j = i ^ stride;
                    if (j > i) {
                        const unsigned long long a = cand[i], b = cand[j];
                        if ((a < b) == ((i & size) == 0)) { cand[i] = b; cand[j] = a; }
                    }
                }
                __syncthreads();
            }
        }
    }
    auto pool_at = [&](int r) { return (int32_t)(0xffffffffu - (uint32_t)(cand[r] & 0xffffffffull)); };
    for (int r = tid; r < TOPK_POOLS; r += blockDim.x) sel_pools[r] = r < k ? pool_at(r) : -1;
    dsa_expand<KP, TOPK_POOLS>(pool_at, k, s, t, sel_tokens);
}

template <int KP, int TOPK_POOLS>
__global__ void __launch_bounds__(DSA_TOPK_THREADS) dsa_topk_select(
    const float* __restrict__ scores, const int32_t* __restrict__ seq_len, const int32_t* __restrict__ tau,
    int32_t* __restrict__ sel_pools, int32_t* __restrict__ sel_tokens) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    dsa_topk_select_body<KP, TOPK_POOLS>(scores, seq_len, tau, sel_pools, sel_tokens);
}

}  // namespace kbp
