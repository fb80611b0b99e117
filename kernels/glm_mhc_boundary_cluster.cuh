// glm_mhc_boundary_cluster.cuh: the hyper-connection boundary of glm_mhc_boundary.cuh (the previous
// site's post-mix or the expand of the embedding row, optionally behind the MoE combine; the next
// site's mix GEMV, gates and collapse; its RMSNorm) as one thread-block cluster per token. The math
// and every summation order are glm_mhc.cuh's, bit for bit; only where the partial sums travel
// changes: through distributed shared memory inside the cluster instead of hand-off slots in L2
// read by two tail CTAs.
//
// Launch contract (as hc_boundary, kernels/glm_mhc_boundary.cuh, with these differences)
//   hc_boundary_cluster<N, D, SRC, R, K, CL>(PreParams<N, R, K> p): grid (CL, m), block
//     cluster_boundary_threads(N, CL), compile-time clusters of CL CTAs (one per token), no dynamic
//     shared memory. CL is 8 or 16 (16 is a non-portable cluster size: the launcher opts the kernel
//     in; CL 8 takes 800 threads, so N <= 4, and spills ~84 bytes a thread under the K > 0 combine).
//     D % 256 == 0. p.work and p.counters are not used. With p.comb != nullptr rank 0 also
//     writes the post gates and runs the softmax + Sinkhorn (after its normed stores); the product
//     leaves them to hc_gates (comb == nullptr).
//
// Work split. The family's 256 tree threads (thread tt sums the flat stream elements tt + 256 j, j
// in order, then the halving tree from level 128) are shared out in runs: CTA c owns the TPC =
// 256 / CL tree threads TPC c .. TPC c + TPC - 1, so its loads of a Phi row are whole 32-byte
// sectors. Because D % 256 == 0 a tree thread's elements are all N streams at the columns tt + 256 q,
// so the CTA owns those columns: it computes their post-mix itself and runs every chain of its tree
// threads (the (2+N)N mix rows and the stream sum of squares: one lane a tree thread, CL / 8 chains a
// warp side by side, the Phi row in registers from before the wait). Its per-tree-thread sums wait
// in shared memory for cluster barrier #1. Then each CTA finishes the 256-wide trees it needs
// (tree256_warp's order) from the CL CTAs' values read through distributed shared memory, one warp a
// tree: the pre rows and the sum of squares (for the collapse), and the mu rows r with r % CL == c
// that it writes. The collapse of its columns follows (pre gates, rn_bf16 of the N-term tree), each
// tree thread's sum of squares of the collapsed row over its columns, barrier #2, and the row
// norm's tree from the cluster's values (one warp in each CTA: the same bits everywhere). No global
// store comes before a release barrier (a release waits for them): the normed row, the streams
// (x_out), mu, the post gates and the collapsed row are all stored after barrier #3's relaxed
// arrive, whose wait keeps shared memory alive until every CTA has read it.
// PDL: every CTA releases its dependents first (they then launch only once the cluster's CTAs are
// resident), loads its Phi share, alpha, beta and gamma, and waits before the first read of an
// earlier kernel's output.
//
// Not the product's form (kbpc/codegen/families/glm_mhc.py BOUNDARY_CLUSTER, off): measured on an
// H200 (128-expert seed shrink, 1k context, logits bit-equal) the step took 4.99-5.00 ms against
// 4.82 with the slot form, the boundary 7.3 us after the KDA output projection (slot form 5.8) and
// 10.7 us after the routed down (8.7). ncu (one MoE boundary, caches flushed): a third of the warp
// samples wait at the barrier after the stream loads, which only 4 of the 13 warps issue, and an
// eighth in the prologue's 64 Phi loads a lane (load-queue throttle); the slot form spreads the same
// loads over 58 SMs. Staging Phi in shared memory by cp.async instead ran slower still (5.09-5.11
// ms). Probes ending the kernel after the chains end it 3.9 us after ready (the slot boundary 6.2):
// the 3.7 us after barrier #1 lose, measured while every thread still computed the N pre gates (an
// exp in double each); they now come from the N threads that compute the pre rows' mu, not yet
// measured in the step. bench/NOTES.md, twenty-seventh session.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "glm_mhc_boundary.cuh"

namespace kbp {
namespace mhc {

// Threads of a CTA: one lane per tree thread of a chain, 32 / (256 / CL) = CL / 8 chains a warp.
__host__ __device__ constexpr int cluster_boundary_threads(int n, int cl) {
    return 32 * ((boundary_chains(n) + cl / 8 - 1) / (cl / 8));
}

// Tree thread of local index l (0 .. 256/CL - 1) in CTA c: one run of 256/CL consecutive tree
// threads, so a CTA's loads of a Phi row are whole 32-byte sectors.
template <int CL>
__device__ __forceinline__ int cluster_tree_thread(int c, int l) {
    return kTreeThreads / CL * c + l;
}

// The 256-wide tree of one sum from its 256 per-tree-thread values, which CTA i / TPC holds at
// lv[i % TPC]: lane l reads l, l + 32, ..., l + 224 (all eight loads in flight together), then
// tree256_warp's order. Lane 0 gets the total.
template <int CL, class Cluster>
__device__ __forceinline__ float cluster_tree(Cluster& cluster, float* lv, int lane) {
    constexpr int TPC = kTreeThreads / CL;
    float a[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
        const int i = lane + 32 * q;
        a[q] = *cluster.map_shared_rank(lv + i % TPC, i / TPC);
    }
    return tree256_lanes(a);
}

template <int N, int D, int SRC, int R, int K, int CL>
__device__ __forceinline__ void hc_boundary_cluster_body(const PreParams<N, R, K>& p) {
    namespace cg = cooperative_groups;
    constexpr int ROWS = (2 + N) * N, CHAINS = boundary_chains(N), ND = N * D;
    constexpr int KPT = ND / kTreeThreads, QD = D / kTreeThreads;
    // Phi values a lane holds from before the wait: 64 at 416 threads (CL 16); at 800 (CL 8) 32, the
    // rest loaded in the chain (64 spill under the 80-register bound of 800 threads).
    constexpr int PFMAX = CL == 16 ? kPhiPrefetch : kPhiPrefetch / 2;
    constexpr int PF = KPT < PFMAX ? KPT : PFMAX;
    constexpr int TPC = kTreeThreads / CL, CPW = 32 / TPC;
    constexpr int THREADS = cluster_boundary_threads(N, CL), WARPS = THREADS / 32;
    constexpr int COLS = TPC * QD, PAIRS = COLS / 2;  // the CTA's columns (of every stream)
    constexpr int PIT = (PAIRS + THREADS - 1) / THREADS, CIT = (COLS + THREADS - 1) / THREADS;
    constexpr int SQ = CHAINS;  // lv row of the collapsed row's sum of squares
    static_assert(CL == 8 || CL == 16, "8 (portable) or 16 CTAs a cluster");
    static_assert(D % kTreeThreads == 0, "a CTA owns whole columns");
    static_assert(THREADS <= 1024, "one lane per tree thread of every chain (CL 8: N <= 4)");
    static_assert(N * N <= 32, "the Sinkhorn warp holds the N x N comb matrix");
    static_assert(ND <= kMaxBoundaryFlat, "the CTA's stream values live in shared memory");
    static_assert(K == 0 || R == 1, "a fused MoE combine is one rank's output");
    __shared__ __align__(16) float xs[KPT * TPC];  // xs[j * TPC + l]: element tt(l) + 256 j
    __shared__ float ys[COLS];                      // collapsed values, [q][l]
    __shared__ float lv[CHAINS + 1][TPC];           // per-tree-thread sums the cluster reads
    __shared__ float s_ab[3 + ROWS], s_dot[CHAINS], s_mu[ROWS], s_pre[N];
    __shared__ float s_r;

    cg::cluster_group cluster = cg::this_cluster();
    const int c = (int)cluster.block_rank();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const size_t t = blockIdx.y;
    const int chain = warp * CPW + lane / TPC, l = lane % TPC;
    const int tt = cluster_tree_thread<CL>(c, l);
    const bool gates_here = p.comb != nullptr;
    auto column = [&](int e) { return cluster_tree_thread<CL>(c, e % TPC) + kTreeThreads * (e / TPC); };
    auto xs_at = [&](int i, int e) -> float* { return xs + (i * QD + e / TPC) * TPC + e % TPC; };  // stream i, column e

    pdl_launch_dependents();
    // Before the wait: this lane's Phi row (the sum-of-squares lanes and the idle chain read the
    // last row too, unused: no branch, so no load can sink past the wait), gamma, alpha and beta.
    const __nv_bfloat16* phi = p.phi + (size_t)(chain < ROWS ? chain : ROWS - 1) * ND + tt;
    __nv_bfloat16 wv[PF];
#pragma unroll
    for (int j = 0; j < PF; ++j) wv[j] = __ldg(phi + kTreeThreads * j);
    float gam[CIT];
#pragma unroll
    for (int s = 0; s < CIT; ++s) {
        const int e = tid + THREADS * s;
        gam[s] = e < COLS ? bf16_to_f32(__ldg(p.gamma + column(e))) : 0.0f;
    }
    for (int i = tid; i < 3 + ROWS; i += THREADS) s_ab[i] = i < 3 ? __ldg(p.alpha + i) : __ldg(p.beta + i - 3);
    pdl_wait();

    // 1. The streams of the CTA's columns (neighbouring column pairs, every load first), post-mixed
    //    into xs (x_out is stored from there at the end).
    {
        float pin[N], cin[N * N];
        post_gates_in<N, SRC>(p, t, pin, cin);
        float2 xv[PIT][N];
        float uv[PIT][2];
#pragma unroll
        for (int it = 0; it < PIT; ++it) {  // every load first
            const int pi = tid + THREADS * it;
            if (pi >= PAIRS) break;
            pair_loads<N, D, SRC>(p, t, column(2 * pi), xv[it], uv[it]);
        }
#pragma unroll
        for (int it = 0; it < PIT; ++it) {
            const int pi = tid + THREADS * it;
            if (pi >= PAIRS) break;
            float o[2][N];
            pair_streams<N, SRC>(xv[it], uv[it], pin, cin, o);
#pragma unroll
            for (int i = 0; i < N; ++i) *reinterpret_cast<float2*>(xs_at(i, 2 * pi)) = make_float2(o[0][i], o[1][i]);
        }
    }
    __syncthreads();

    // 2. Every chain of the CTA's tree threads.
    {
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < KPT; ++j) {
            const float xv = xs[j * TPC + l];
            float term;
            if (chain < ROWS) {
                const float w = bf16_to_f32(j < PF ? wv[j < PF ? j : 0] : __ldg(phi + kTreeThreads * j));
                term = xv * w;
            } else {
                term = xv * xv;
            }
            acc = j ? acc + term : term;
        }
        if (chain < CHAINS) lv[chain][l] = acc;
    }
    // #1: every CTA's chain sums of the mix rows and the sum of squares. No global store comes
    // before a release (it would wait for them): they all go out after #3's arrive.
    cluster_arrive_release();
    cluster_wait_acquire();

    // 3. The trees this CTA needs, one a warp: jobs 0..N-1 the pre rows, N the sum of squares, then
    //    the mu rows from N on that it writes (r % CL == c), or with the gates here on rank 0 every
    //    row from N on.
    const bool all_rows = gates_here && c == 0;
    const int first_own = c >= N ? c : c + (N - c + CL - 1) / CL * CL;  // least r >= N, r % CL == c
    auto job_row = [&](int j) {
        if (j < N) return j;
        if (j == N) return ROWS;
        const int r = all_rows ? j - 1 : (p.mix != nullptr ? first_own + CL * (j - N - 1) : ROWS);
        return r < ROWS ? r : -1;
    };
    for (int j = warp, r = job_row(j); r >= 0; j += WARPS, r = job_row(j)) {
        const float d = cluster_tree<CL>(cluster, &lv[r][0], lane);
        if (lane == 0) s_dot[r] = d;
    }
    __syncthreads();
    if (tid < CHAINS) {
        const int r = job_row(tid);
        if (r >= 0 && r < ROWS) s_mu[r] = s_dot[r] * rsqrt_f32(s_dot[ROWS] / (float)(N * D) + p.eps_n);
        if (tid < N) s_pre[tid] = sigmoid_f32(s_ab[0] * s_mu[tid] + s_ab[3 + tid]) + p.eps_hc;  // job tid: row tid
    }
    __syncthreads();

    // 4. Collapse of the CTA's columns, then each tree thread's sum of squares over them (in column
    //    order, as collapse_norm).
    float y[CIT];
    {
        float pre[N];
#pragma unroll
        for (int i = 0; i < N; ++i) pre[i] = s_pre[i];
#pragma unroll
        for (int s = 0; s < CIT; ++s) {
            const int e = tid + THREADS * s;
            y[s] = 0.0f;
            if (e >= COLS) continue;
            float terms[N];
#pragma unroll
            for (int i = 0; i < N; ++i) terms[i] = pre[i] * *xs_at(i, e);
            y[s] = round_bf16(tree_n<N>(terms));
            ys[e] = y[s];
        }
    }
    __syncthreads();
    if (tid < TPC) {
        float ss = 0.0f;
#pragma unroll
        for (int q = 0; q < QD; ++q) {
            const float v = ys[q * TPC + tid];
            const float sq = v * v;
            ss = q ? __fadd_rn(ss, sq) : sq;
        }
        lv[SQ][tid] = ss;
    }
    cluster_arrive_release();  // #2: the collapsed row's per-tree-thread sums
    cluster_wait_acquire();

    // 5. The row norm's tree (the same bits in every CTA), the normed stores.
    if (warp == 0) {
        const float total = cluster_tree<CL>(cluster, &lv[SQ][0], lane);
        if (lane == 0) s_r = rsqrt_f32(total / (float)D + p.eps);
    }
    __syncthreads();
    cluster_arrive_relaxed();  // #3: this CTA's reads of the others' shared memory are done
    // Every global store: the normed row, then the streams, mu, the post gates and the collapsed row.
    const float rr = s_r;
#pragma unroll
    for (int s = 0; s < CIT; ++s) {
        const int e = tid + THREADS * s;
        if (e < COLS) p.normed[t * D + column(e)] = f32_to_bf16((y[s] * rr) * gam[s]);
    }
    if constexpr (SRC != kSrcStreams) {
        for (int pi = tid; pi < N * PAIRS; pi += THREADS) {
            const int i = pi / PAIRS, e = 2 * (pi % PAIRS);
            *reinterpret_cast<float2*>(p.x_out + (t * N + i) * D + column(e)) = *reinterpret_cast<const float2*>(xs_at(i, e));
        }
    }
    if (p.mix != nullptr && c + CL * tid < ROWS) p.mix[t * ROWS + c + CL * tid] = s_mu[c + CL * tid];
    if (all_rows && tid < N) p.post[t * N + tid] = post_gate(s_mu[N + tid], s_ab[1], s_ab[3 + N + tid]);
    if (p.collapsed) {
#pragma unroll
        for (int s = 0; s < CIT; ++s) {
            const int e = tid + THREADS * s;
            if (e < COLS) p.collapsed[t * D + column(e)] = f32_to_bf16(y[s]);
        }
    }
    if (all_rows && warp == 0) {
        hc_gates_warp<N>(s_mu, s_ab, s_ab + 3, p.eps_hc, p.iters, nullptr, p.comb, t, lane);
    }
    cluster_wait();
}

template <int N, int D, int SRC, int R, int K, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(cluster_boundary_threads(N, CL), 1)
    hc_boundary_cluster(const PreParams<N, R, K> p) {
    hc_boundary_cluster_body<N, D, SRC, R, K, CL>(p);
}

}  // namespace mhc
}  // namespace kbp
