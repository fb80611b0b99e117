// glm_mhc_boundary.cuh: a hyper-connection boundary in one launch (explain.families.glm_mhc): the
// previous site's post-mix (or the expand of the embedding row), the next site's pre-mix (mix GEMV,
// gates, Sinkhorn, collapse) and its RMSNorm; and the stream mean (head) fused with the final
// RMSNorm (explain.families.rms_norm), optionally behind the last post-mix.
//
// Launch contract (N = n_hc, D = hidden, m tokens on grid.y; rows dense and 4-byte aligned; a stream
// tensor is [m][N*D] FP32, stream i at i*D; comb is [m][N*N] with comb[i*N+j] = C_ij)
//   hc_boundary<N, D, SRC, R, RPC>(PreParams p): grid (boundary_ctas(N, RPC), m), block kPreThreads
//     (288), no dynamic shared memory. SRC (StreamSource) says where the streams come from:
//     kSrcStreams p.x; kSrcPost the post-mix of p.x with the rank sum of p.parts, p.post_in and
//     p.comb_in, stored to p.x_out (must not alias p.x); kSrcExpand p.h widened into every stream,
//     stored to p.x_out. p.work holds [m][(2+N)N+1][128] floats of partial sums (scratch),
//     p.counters [m] arrival counters (zero before the first launch, left zero for the next launch
//     or graph replay). p.mix (mu) and p.collapsed may be nullptr; with p.comb == nullptr the gates
//     and Sinkhorn are left to hc_gates (which then needs p.mix). N*D <= 81920 (shared memory).
//   hc_head_norm<N, D, THREADS, ONE_PLUS, POST, R>(HeadParams p): grid (m), block THREADS =
//     kbpc.reference.rms_norm.block_threads(D); D even. POST: the streams are first the post-mix of
//     p.x (as kSrcPost; stored to p.x_out unless it is nullptr). p.head (the BF16 mean) may be nullptr.
// Work split of hc_boundary (the math is glm_mhc.cuh's; every sum keeps its order):
//   The 256 tree threads of every family sum fall into 8 column groups; group g is the tree threads
//   16g..16g+15 and 16g+128..16g+143 (two 32-byte runs of a Phi row), so the first tree level
//   (t + 128 onto t) is one shuffle inside the group. A CTA is one column group times RPC "chains":
//   chain c < (2+N)N is mix row c (tree thread t: sum over j of x[t+256j] * Phi_c[t+256j], in j
//   order), chain (2+N)N the stream sum of squares. The CTA computes its group's stream values (the
//   post-mix or expand of whole columns when D % 256 == 0) into shared memory, one warp per chain
//   runs the strided sums, folds the first tree level and stores 16 of the 128 level-1 values. The
//   last CTA of a token (arrival counter) finishes every tree from level 64: warps 0..7 the pre and
//   post rows and the sum of squares, the post gates, then collapse + RMSNorm over all columns (the
//   streams read back from L2); warp 8 the comb rows, then softmax + Sinkhorn, the serial path.
// PDL: Phi rows, alpha and beta are read before pdl_wait(); dependents are released right after it
// (every CTA has started by then, so the last-CTA handoff cannot wait on a CTA that is not resident).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "glm_mhc.cuh"
#include "kbp_common.cuh"
#include "kbp_transcendental.cuh"
#include "rms_norm.cuh"

namespace kbp {
namespace mhc {

constexpr int kColGroups = 8;                      // column groups of the 256 tree threads
constexpr int kLevel1 = kTreeThreads / 2;          // values left after the first tree level
constexpr int kBoundaryWarps = kPreThreads / 32;   // 9: warp 8 runs the Sinkhorn in the tail
constexpr int kPhiPrefetch = 64;                   // Phi values a chain thread loads before pdl_wait
constexpr int kMaxBoundaryFlat = 81920;            // N*D: the CTA's stream values in shared memory

__host__ __device__ constexpr int boundary_chains(int n) { return (2 + n) * n + 1; }
__host__ __device__ constexpr int boundary_ctas(int n, int rows_per_cta) {
    return kColGroups * ((boundary_chains(n) + rows_per_cta - 1) / rows_per_cta);
}

// Tree thread of lane `lane` in column group g: lanes 0..15 the run 16g.., lanes 16..31 128 above.
__device__ __forceinline__ int group_tree_thread(int g, int lane) {
    return 16 * g + (lane & 15) + ((lane & 16) << 3);
}

// The 256-wide tree from level 64 on: lane l holds level-1 values l, l+32, l+64, l+96 (a0..a3).
// Lane 0 returns the total.
__device__ __forceinline__ float tree_from_level1(float a0, float a1, float a2, float a3) {
    float v = (a0 + a2) + (a1 + a3);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

// Stream values of this CTA's tree threads into xs[j*32 + lane] (flat element tt + 256 j, +0 past
// the end); the CTA with rg == (column or step) % RG stores them to x_out.
template <int N, int D, int SRC, int R, int RG>
__device__ __forceinline__ void boundary_streams(const PreParams<N, R>& p, size_t t, int rg, int warp,
                                                 int lane, int tt, float* xs) {
    constexpr int ND = N * D, KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    float pin[N], cin[N * N];
#pragma unroll
    for (int i = 0; i < N; ++i) pin[i] = SRC == kSrcPost ? __ldg(p.post_in + t * N + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < N * N; ++i) cin[i] = SRC == kSrcPost ? __ldg(p.comb_in + t * N * N + i) : 0.0f;
    constexpr bool kStore = SRC != kSrcStreams;
    if constexpr (D % kTreeThreads == 0) {
        // Element tt + 256 (i QD + q) is stream i, column tt + 256 q: one column gives N elements.
        constexpr int QD = D / kTreeThreads;
        for (int q = warp; q < QD; q += kBoundaryWarps) {
            const int k = tt + kTreeThreads * q;
            float o[N];
            stream_column<N, D, SRC, R>(p, t, k, pin, cin, o);
#pragma unroll
            for (int i = 0; i < N; ++i) xs[(i * QD + q) * 32 + lane] = o[i];
            if (kStore && q % RG == rg) {
#pragma unroll
                for (int i = 0; i < N; ++i) p.x_out[(t * N + i) * D + k] = o[i];
            }
        }
    } else {
        for (int j = warp; j < KPT; j += kBoundaryWarps) {
            const int f = tt + kTreeThreads * j;
            float v = 0.0f;
            if (f < ND) {
                const int si = f / D;
                float o[N];
                stream_column<N, D, SRC, R>(p, t, f % D, pin, cin, o);
#pragma unroll
                for (int i = 0; i < N; ++i) v = i == si ? o[i] : v;
                if (kStore && j % RG == rg) p.x_out[t * ND + f] = v;
            }
            xs[j * 32 + lane] = v;
        }
    }
}

// One chain over this lane's tree thread tt: a mix row (phi points at its element tt; the first PF
// values are in wv), or with phi == nullptr the sum of squares. Returns the level-1 value in lanes
// 0..15.
template <int ND, int KPT, int PF>
__device__ __forceinline__ float boundary_chain(const float* xs, const __nv_bfloat16 (&wv)[PF],
                                                const __nv_bfloat16* phi, int tt, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KPT; ++j) {
        const float xv = xs[j * 32 + lane];
        float term;
        if (phi == nullptr) {
            term = xv * xv;
        } else {
            const bool in = tt + kTreeThreads * j < ND;
            const float w = j < PF ? bf16_to_f32(wv[j < PF ? j : 0])
                                   : (in ? bf16_to_f32(__ldg(phi + kTreeThreads * j)) : 0.0f);
            term = xv * w;
        }
        acc = j ? acc + term : term;  // past the end: +0 * +0 added, as the zero-padded reference
    }
    return acc + __shfl_down_sync(0xffffffffu, acc, 16);  // first tree level: t + 128 onto t
}

// Tail, warp 8: mu of the comb rows, then softmax + Sinkhorn (if p.comb).
template <int N, int D, int R>
__device__ __forceinline__ void boundary_gates_warp(const PreParams<N, R>& p, const float* part, size_t t,
                                                    int lane, const float* ab, float* mu) {
    constexpr int ROWS = (2 + N) * N, FIRST = 2 * N;
    const float* ssp = part + ROWS * kLevel1;
    float ss = tree_from_level1(__ldcg(ssp + lane), __ldcg(ssp + lane + 32), __ldcg(ssp + lane + 64),
                                __ldcg(ssp + lane + 96));
    ss = __shfl_sync(0xffffffffu, ss, 0);
    const float r = rsqrt_f32(ss / (float)(N * D) + p.eps_n);
    float a[ROWS - FIRST][4];
#pragma unroll
    for (int m = 0; m < ROWS - FIRST; ++m) {
#pragma unroll
        for (int q = 0; q < 4; ++q) a[m][q] = __ldcg(part + (FIRST + m) * kLevel1 + lane + 32 * q);
    }
#pragma unroll
    for (int m = 0; m < ROWS - FIRST; ++m) {
        const float d = tree_from_level1(a[m][0], a[m][1], a[m][2], a[m][3]);
        if (lane == 0) {
            mu[FIRST + m] = d * r;
            if (p.mix) p.mix[t * ROWS + FIRST + m] = d * r;
        }
    }
    __syncwarp();
    // The post gates are the tree warps' (boundary_collapse): off this warp's serial path.
    if (p.comb != nullptr) hc_gates_warp<N>(mu, ab, ab + 3, p.eps_hc, p.iters, nullptr, p.comb, t, lane);
}

// Tail, warps 0..7: mu of the pre and post rows, the post gates (if p.comb), collapse and RMSNorm.
// s_part stages the level-1 values of rows 0..2N-1 and of the sum of squares (row 2N there).
template <int N, int D, int SRC, int R>
__device__ __forceinline__ void boundary_collapse(const PreParams<N, R>& p, const float* part, size_t t,
                                                  int tid, const float* ab, float* mu, float* s_part,
                                                  float* s_dot, float* red, float* total) {
    constexpr int ROWS = (2 + N) * N, QD = (D + kTreeThreads - 1) / kTreeThreads;
    constexpr bool kCache = D % kTreeThreads == 0 && N * QD <= kMaxCachedPerThread / 2;
    const int warp = tid >> 5, lane = tid & 31;
    // Every load first: the level-1 values of the pre rows and the sum of squares, gamma, streams.
    for (int i = tid; i < (2 * N + 1) * kLevel1; i += kTreeThreads) {
        const int row = i / kLevel1;
        s_part[i] = __ldcg(part + (row < 2 * N ? row : ROWS) * kLevel1 + i % kLevel1);
    }
    float gam[QD];
#pragma unroll
    for (int q = 0; q < QD; ++q) {
        const int k = tid + kTreeThreads * q;
        gam[q] = k < D ? bf16_to_f32(__ldg(p.gamma + k)) : 0.0f;
    }
    auto load = [&](int i, int k) -> float {
        if constexpr (SRC == kSrcExpand) return bf16_to_f32(__ldg(p.h + t * D + k));
        else if constexpr (SRC == kSrcPost) return __ldcg(p.x_out + (t * N + i) * D + k);  // other CTAs' stores
        else return __ldg(p.x + (t * N + i) * D + k);
    };
    constexpr int kCached = kCache ? (SRC == kSrcExpand ? QD : N * QD) : 1;
    float xr[kCached];
    if constexpr (kCache) {
#pragma unroll
        for (int e = 0; e < kCached; ++e) xr[e] = load(e / QD, tid + kTreeThreads * (e % QD));
    }
    bar_tree();
    for (int row = warp; row <= 2 * N; row += kTreeThreads / 32) {
        const float* v = s_part + row * kLevel1;
        const float d = tree_from_level1(v[lane], v[lane + 32], v[lane + 64], v[lane + 96]);
        if (lane == 0) s_dot[row] = d;
    }
    bar_tree();
    if (tid < 2 * N) {
        const float m = s_dot[tid] * rsqrt_f32(s_dot[2 * N] / (float)(N * D) + p.eps_n);
        mu[tid] = m;
        if (p.mix) p.mix[t * ROWS + tid] = m;
        if (tid >= N && p.comb != nullptr) p.post[t * N + tid - N] = post_gate(m, ab[1], ab[3 + tid]);
    }
    bar_tree();
    if constexpr (kCache) {
        collapse_norm<N, D, R>(p, mu, ab, t, tid, gam, red, total, [&](int i, int q, int) {
            return xr[SRC == kSrcExpand ? q : i * QD + q];
        });
    } else {
        collapse_norm<N, D, R>(p, mu, ab, t, tid, gam, red, total, [&](int i, int, int k) { return load(i, k); });
    }
}

template <int N, int D, int SRC, int R, int RPC>
__device__ __forceinline__ void hc_boundary_body(const PreParams<N, R>& p) {
    constexpr int ROWS = (2 + N) * N, CHAINS = boundary_chains(N), ND = N * D;
    constexpr int KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    constexpr int RG = (CHAINS + RPC - 1) / RPC;
    constexpr int PF = KPT < kPhiPrefetch ? KPT : kPhiPrefetch;
    static_assert(N * N <= 32, "the Sinkhorn warp holds the N x N comb matrix");
    static_assert(RPC >= 1 && RPC <= kBoundaryWarps, "one warp per chain");
    static_assert(ND <= kMaxBoundaryFlat, "the CTA's stream values live in shared memory");
    __shared__ float xs[KPT * 32];
    __shared__ float s_ab[3 + ROWS];
    __shared__ float s_mu[ROWS];
    __shared__ float s_part[(2 * N + 1) * kLevel1];
    __shared__ float s_dot[2 * N + 1];
    __shared__ float red[kTreeThreads];
    __shared__ float s_total;
    __shared__ unsigned int s_last;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = blockIdx.x % kColGroups, rg = blockIdx.x / kColGroups;
    const size_t t = blockIdx.y;
    const int tt = group_tree_thread(g, lane);
    const int chain = rg * RPC + warp;
    const bool has_chain = warp < RPC && chain < CHAINS;
    const __nv_bfloat16* phi = has_chain && chain < ROWS ? p.phi + (size_t)chain * ND + tt : nullptr;

    // Weights before the dependency wait: this warp's Phi row into registers, alpha and beta.
    __nv_bfloat16 wv[PF];
#pragma unroll
    for (int j = 0; j < PF; ++j) {
        const bool in = phi != nullptr && tt + kTreeThreads * j < ND;
        wv[j] = in ? __ldg(phi + kTreeThreads * j) : __float2bfloat16_rn(0.0f);
    }
    for (int i = tid; i < 3 + ROWS; i += kPreThreads) s_ab[i] = i < 3 ? __ldg(p.alpha + i) : __ldg(p.beta + i - 3);
    pdl_wait();
    pdl_launch_dependents();

    boundary_streams<N, D, SRC, R, RG>(p, t, rg, warp, lane, tt, xs);
    __syncthreads();
    if (has_chain) {
        const float v = boundary_chain<ND, KPT, PF>(xs, wv, phi, tt, lane);
        if (lane < 16) p.work[(t * CHAINS + chain) * kLevel1 + 16 * g + lane] = v;
    }
    __syncthreads();
    if (tid == 0) {
        // Release: this CTA's partials and x_out stores before its count; acquire: the last CTA
        // sees every CTA's.
        s_last = atomic_add_acq_rel_gpu(p.counters + t, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!s_last) return;
    if (tid == 0) p.counters[t] = 0;  // every CTA of this token has counted: re-arm
    const float* part = p.work + t * CHAINS * kLevel1;
    if (warp == kBoundaryWarps - 1) {
        boundary_gates_warp<N, D, R>(p, part, t, lane, s_ab, s_mu);
        return;
    }
    boundary_collapse<N, D, SRC, R>(p, part, t, tid, s_ab, s_mu, s_part, s_dot, red, &s_total);
}

template <int N, int D, int SRC, int R, int RPC>
__global__ void __launch_bounds__(kPreThreads, 1) hc_boundary(const PreParams<N, R> p) {
    hc_boundary_body<N, D, SRC, R, RPC>(p);
}

// ------------------------------------------------------------------ head + final RMSNorm

template <int N, int R>
struct HeadParams {
    const float* x;                 // [m][N*D] streams (POST: before the last post-mix)
    RankParts<R> parts;             // POST: partial sublayer outputs [m][D] per rank
    const float* post_in;           // POST: [m][N]
    const float* comb_in;           // POST: [m][N*N]
    float* x_out;                   // POST: [m][N*D] the post-mix streams, or nullptr
    const __nv_bfloat16* gamma;     // [D] final norm weight
    float eps;
    __nv_bfloat16* head;            // [m][D] rn_bf16(mean of the streams), or nullptr
    __nv_bfloat16* normed;          // [m][D]
};

// head_k = rn_bf16(tree_i x_i[k] * fl(1/N)); then kbp::rms_norm's order over head: thread t owns
// pairs t, t + THREADS, ... and adds (h_2p)^2 then (h_2p+1)^2 from +0; warp butterfly, butterfly
// over the warp sums; r = rsqrtf(ss / D + eps), y = rn_bf16((h r) w), w = 1 + gamma | gamma.
template <int N, int D, int THREADS, bool ONE_PLUS, bool POST, int R>
__device__ __forceinline__ void hc_head_norm_body(const HeadParams<N, R>& p) {
    static_assert(D % 2 == 0 && THREADS % 32 == 0 && THREADS <= 1024, "pairs over whole warps");
    constexpr int PAIRS = D / 2, PER = (PAIRS + THREADS - 1) / THREADS;
    __shared__ float warp_sums[THREADS / 32];
    const size_t t = blockIdx.x;
    const int tid = threadIdx.x;
    float2 gm[PER];  // the norm weight, before the dependency wait
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        const int pr = tid + s * THREADS;
        gm[s] = pr < PAIRS ? bf16x2_load(p.gamma + 2 * pr) : make_float2(0.0f, 0.0f);
    }
    pdl_wait();
    pdl_launch_dependents();
    float pin[N], cin[N * N];
#pragma unroll
    for (int i = 0; i < N; ++i) pin[i] = POST ? __ldg(p.post_in + t * N + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < N * N; ++i) cin[i] = POST ? __ldg(p.comb_in + t * N * N + i) : 0.0f;
    const float inv_n = 1.0f / (float)N;
    float2 h[PER];
    float partial = 0.0f;
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        const int pr = tid + s * THREADS;
        if (pr >= PAIRS) break;
        float hv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int k = 2 * pr + e;
            float xc[N], o[N];
#pragma unroll
            for (int i = 0; i < N; ++i) xc[i] = __ldg(p.x + (t * N + i) * D + k);
            if constexpr (POST) {
                post_mix_column<N>(xc, rank_sum<R>(p.parts, t * D + k), pin, cin, o);
                if (p.x_out) {
#pragma unroll
                    for (int i = 0; i < N; ++i) p.x_out[(t * N + i) * D + k] = o[i];
                }
            } else {
#pragma unroll
                for (int i = 0; i < N; ++i) o[i] = xc[i];
            }
            hv[e] = round_bf16(tree_n<N>(o) * inv_n);
        }
        if (p.head) bf16x2_store(p.head + t * D + 2 * pr, hv[0], hv[1]);
        h[s] = make_float2(hv[0], hv[1]);
        partial = partial + hv[0] * hv[0];
        partial = partial + hv[1] * hv[1];
    }
    const float ss = rms_block_sum<THREADS>(partial, warp_sums);
    const float rr = rsqrt_f32(ss / (float)D + p.eps);
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        const int pr = tid + s * THREADS;
        if (pr >= PAIRS) break;
        const float w0 = ONE_PLUS ? 1.0f + gm[s].x : gm[s].x;
        const float w1 = ONE_PLUS ? 1.0f + gm[s].y : gm[s].y;
        bf16x2_store(p.normed + t * D + 2 * pr, h[s].x * rr * w0, h[s].y * rr * w1);
    }
}

template <int N, int D, int THREADS, bool ONE_PLUS, bool POST, int R>
__global__ void __launch_bounds__(THREADS) hc_head_norm(const HeadParams<N, R> p) {
    hc_head_norm_body<N, D, THREADS, ONE_PLUS, POST, R>(p);
}

}  // namespace mhc
}  // namespace kbp
