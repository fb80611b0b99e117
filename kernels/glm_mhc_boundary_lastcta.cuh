// glm_mhc_boundary_lastcta.cuh: the one-launch hyper-connection boundary that hc_boundary
// (glm_mhc_boundary.cuh) replaced, kept only so the benchmark (bench/kernels_misc.py) can time the
// two side by side. Same math, same bits; what differs is the hand-off: here every CTA stores its
// partial sums, counts itself in with an acq_rel atomic (a fence and a round trip) and the last CTA
// of a token reads every partial back and runs the whole tail (mu, gates, Sinkhorn, collapse, norm).
//
// Launch contract: hc_boundary_lastcta<N, D, SRC, R, RPC>(PreParams<N, R>): grid
//   (lastcta_ctas(N, RPC), m), block kPreThreads (288), no dynamic shared memory; p.work holds
//   [m][(2+N)N+1][128] FP32 partial sums (scratch, read as floats), p.counters [m] arrival counters
//   (zero before the first launch, left zero). Otherwise as hc_boundary. RPC <= 9.
// Work split: CTA = column group g (blockIdx.x % 8) x chain group rg (blockIdx.x / 8); the CTA's
//   stream values into shared memory (9 warps over the columns), one warp per chain, the first tree
//   level in-CTA; the last CTA: warps 0..7 the pre/post rows, gates, collapse + RMSNorm over all
//   columns (the streams read back from L2), warp 8 the comb rows and softmax + Sinkhorn.
#pragma once

#include "glm_mhc_boundary.cuh"

namespace kbp {
namespace mhc {

__host__ __device__ constexpr int lastcta_ctas(int n, int rows_per_cta) {
    return kColGroups * ((boundary_chains(n) + rows_per_cta - 1) / rows_per_cta);
}

// Stream values of this CTA's tree threads into xs[j*32 + lane] (flat element tt + 256 j, +0 past
// the end); the CTA with rg == (column or step) % RG stores them to x_out.
template <int N, int D, int SRC, int R, int RG>
__device__ __forceinline__ void lastcta_streams(const PreParams<N, R>& p, size_t t, int rg, int warp,
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
            stream_column<N, D, SRC>(p, t, k, pin, cin, o);
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
                stream_column<N, D, SRC>(p, t, f % D, pin, cin, o);
#pragma unroll
                for (int i = 0; i < N; ++i) v = i == si ? o[i] : v;
                if (kStore && j % RG == rg) p.x_out[t * ND + f] = v;
            }
            xs[j * 32 + lane] = v;
        }
    }
}

// Tail, warp 8: mu of the comb rows, then softmax + Sinkhorn (if p.comb).
template <int N, int D, int R>
__device__ __forceinline__ void lastcta_gates_warp(const PreParams<N, R>& p, const float* part, size_t t,
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
    // The post gates are the tree warps' (lastcta_collapse): off this warp's serial path.
    if (p.comb != nullptr) hc_gates_warp<N>(mu, ab, ab + 3, p.eps_hc, p.iters, nullptr, p.comb, t, lane);
}

// Tail, warps 0..7: mu of the pre and post rows, the post gates (if p.comb), collapse and RMSNorm.
// s_part stages the level-1 values of rows 0..2N-1 and of the sum of squares (row 2N there).
template <int N, int D, int SRC, int R>
__device__ __forceinline__ void lastcta_collapse(const PreParams<N, R>& p, const float* part, size_t t,
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
        collapse_norm<N, D>(p, mu, ab, t, tid, gam, red, total, [&](int i, int q, int) {
            return xr[SRC == kSrcExpand ? q : i * QD + q];
        });
    } else {
        collapse_norm<N, D>(p, mu, ab, t, tid, gam, red, total, [&](int i, int, int k) { return load(i, k); });
    }
}

template <int N, int D, int SRC, int R, int RPC>
__device__ __forceinline__ void hc_boundary_lastcta_body(const PreParams<N, R>& p) {
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

    lastcta_streams<N, D, SRC, R, RG>(p, t, rg, warp, lane, tt, xs);
    __syncthreads();
    if (has_chain) {
        const float v = boundary_chain<ND, KPT, PF>(xs, wv, phi, tt, lane);
        if (lane < 16) reinterpret_cast<float*>(p.work)[(t * CHAINS + chain) * kLevel1 + 16 * g + lane] = v;
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
    const float* part = reinterpret_cast<const float*>(p.work) + t * CHAINS * kLevel1;
    if (warp == kBoundaryWarps - 1) {
        lastcta_gates_warp<N, D, R>(p, part, t, lane, s_ab, s_mu);
        return;
    }
    lastcta_collapse<N, D, SRC, R>(p, part, t, tid, s_ab, s_mu, s_part, s_dot, red, &s_total);
}

template <int N, int D, int SRC, int R, int RPC>
__global__ void __launch_bounds__(kPreThreads, 1) hc_boundary_lastcta(const PreParams<N, R> p) {
    hc_boundary_lastcta_body<N, D, SRC, R, RPC>(p);
}

}  // namespace mhc
}  // namespace kbp
