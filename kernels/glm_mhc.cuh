// glm_mhc.cuh: GLM-5 manifold-constrained hyper-connections (explain.families.glm_mhc): expand,
// fused pre-mix (mix GEMV + gates + Sinkhorn + collapse + site RMSNorm), post-mix, head mean.
// The one-launch boundary the lowering uses (hc_boundary, over many more CTAs) and the head + final
// norm live in glm_mhc_boundary.cuh; hc_pre_norm here is the 24-CTA form it replaced (benchmarks).
//
// Launch contract (N = n_hc streams, D = hidden; m tokens on grid.y; rows dense, 4-byte aligned;
// a stream tensor is [m][N*D] FP32, stream i at i*D; comb is [m][N*N] with comb[i*N+j] = C_ij)
//   hc_expand<N, D, VEC>(h, x): x_i = h.  grid (ceil(D / (block*VEC)), m), any block; D % VEC == 0.
//   hc_pre_norm<N, D, FUSE_POST, R>(PreParams): grid ((2+N)*N, m), block kPreThreads (288), no
//     dynamic shared memory. Block `row` computes mu_row (threads 0..255), the last block of a token
//     to finish (a counter per token, left at zero again for the next launch or graph replay) runs
//     the tail: warp 8 does the gates + Sinkhorn and writes post/comb while warps 0..7 collapse the
//     streams with the pre gates and apply the site RMSNorm. `mix` is the mu workspace (written).
//     FUSE_POST: the streams are first produced by the previous site's post-mix (rank sum of
//     `parts`, post_in, comb_in applied to `x`), written to x_out (which must not alias x).
//     With comb == nullptr the tail skips post/comb: hc_gates<N>(mix, alpha, beta, eps_hc, iters,
//     post, comb) (grid (m), block 32) computes them afterwards, e.g. on a side stream, so the
//     Sinkhorn latency leaves the critical path (the post-mix needs comb much later).
//   hc_post<N, D, R, VEC>(x, parts, post, comb, x_out): x_out may alias x.
//     grid (ceil(D / (block*VEC)), m), any block; D % VEC == 0, rows 4*VEC-byte aligned.
//   hc_head<N, D, VEC>(x, y): grid (ceil(D / (block*VEC)), m), any block; D % VEC == 0.
// Math and order (kbpc.reference.glm_mhc; FP32, built without FMA contraction):
//   Every sum of the family is the thread-strided 256-wide sum: thread t adds elements t, t+256,
//   ... in order, then the fixed halving tree (offsets 128..1). Over n_hc terms this is the tree
//   of the terms zero-padded (tree_n); the rank sum alone is sequential in rank order.
//   r = rsqrtf(ss / (N D) + eps_n), mu = dot * r; gates fl(fl(a_c mu) + beta) through
//   sigma = 1 / (1 + expf(-z)); softmax subtracts the row max; Sinkhorn divides by (eps_hc + sum),
//   `iters` column passes with a row pass before each but the first (iters < 1 acts as 1);
//   y = rn_bf16(tree_i fl(pre_i x_i)); yhat = rn_bf16(fl(y * rsqrtf(ss_y / D + eps)) * gamma);
//   x'_j = fl(post_j u) + tree_i fl(C_ij x_i) with u = rn_bf16(seq_rho u^rho);
//   head = rn_bf16(tree_i x_i * fl(1/N)); expand widens the BF16 row exactly.
// Phase stamps of a profiling build (kbp_stamps.cuh): hc_gates only (1/2 around its pdl_wait, 3).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "glm_moe_combine.cuh"
#include "kbp_common.cuh"
#include "kbp_transcendental.cuh"

namespace kbp {
namespace mhc {

constexpr int kTreeThreads = 256;                  // the family's fixed reduction width
constexpr int kPreThreads = kTreeThreads + 32;     // + the Sinkhorn warp of the tail
constexpr int kMaxCachedPerThread = 128;           // stream values a thread keeps in registers

__host__ __device__ constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }

// The tensor-parallel partial sublayer outputs, one BF16 [m][D] buffer per rank (rank order).
template <int R>
struct RankParts {
    const __nv_bfloat16* p[R];
};

// u = rn_bf16(u^0 + u^1 + ...): sequential FP32 in rank order, one rounding (exact for R = 1).
template <int R>
__device__ __forceinline__ float rank_sum(const RankParts<R>& parts, size_t idx) {
    float s = bf16_to_f32(parts.p[0][idx]);
#pragma unroll
    for (int r = 1; r < R; ++r) s = s + bf16_to_f32(parts.p[r][idx]);
    return round_bf16(s);
}

// The sublayer output u a post-mix adds, at columns k0 .. k0+VEC-1 of token t (row width d): the
// rank sum of R BF16 partials, or (MoeCombineIn<K>, R == 1) the MoE combine of K routed slots and
// the shared expert computed in place, rn_bf16 of moe_combine_sums (glm_moe_combine.cuh): the
// bytes the blend would have stored, widened.
// EAGER: moe_combine_sums's loads-first form (false in the 64-register head kernel).
template <int VEC, bool EAGER = true, int R>
__device__ __forceinline__ void branch_u(const RankParts<R>& b, int d, size_t t, int k0, float (&u)[VEC]) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) u[v] = rank_sum<R>(b, t * d + k0 + v);
}
template <int VEC, bool EAGER = true, int K>
__device__ __forceinline__ void branch_u(const MoeCombineIn<K>& b, int d, size_t t, int k0, float (&u)[VEC]) {
    moe_combine_sums<K, VEC, EAGER>(b, d, t, k0, u);
#pragma unroll
    for (int v = 0; v < VEC; ++v) u[v] = round_bf16(u[v]);
}

// The post-mix branch of a params struct: R rank partials (K == 0) or a fused MoE combine of K slots.
template <int R, int K>
struct BranchOf {
    static_assert(R == 1, "a fused MoE combine is one rank's output");
    using type = MoeCombineIn<K>;
};
template <int R>
struct BranchOf<R, 0> {
    using type = RankParts<R>;
};

// The 256-wide tree over N < 256 live terms: the levels above pow2_ceil(N) add +0 to each term
// (turning -0 into +0), then the halving tree over the zero-padded terms.
template <int N>
__device__ __forceinline__ float tree_n(const float (&a)[N]) {
    static_assert(N >= 1 && N <= kTreeThreads / 2, "tree_n covers 1..128 terms");
    constexpr int P = pow2_ceil(N);
    float v[P];
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = i < N ? __fadd_rn(a[i], 0.0f) : 0.0f;
#pragma unroll
    for (int off = P / 2; off >= 1; off /= 2) {
#pragma unroll
        for (int i = 0; i < off; ++i) v[i] = v[i] + v[i + off];
    }
    return v[0];
}

__device__ __forceinline__ unsigned int atomic_add_acq_rel_gpu(unsigned int* p, unsigned int v) {
    unsigned int old;
    asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Named barrier 1 over threads 0..255 only (the Sinkhorn warp does not take part).
__device__ __forceinline__ void bar_tree() { asm volatile("bar.sync 1, 256;" ::: "memory"); }

// Finish the 256-wide tree in one warp from lane l's partials a[q] = partial l + 32 q (level 128,
// 64, 32 in registers, 16..1 by shuffle-down). Lane 0 returns the total.
__device__ __forceinline__ float tree256_lanes(float (&a)[8]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) a[q] = a[q] + a[q + 4];
    a[0] = a[0] + a[2];
    a[1] = a[1] + a[3];
    float v = a[0] + a[1];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

// The same from red[0..256) in shared memory.
__device__ __forceinline__ float tree256_warp(const float* red, int lane) {
    float a[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) a[q] = red[lane + 32 * q];
    return tree256_lanes(a);
}

// x'_j = fl(post_j u) + tree_i fl(C_ij x_i) for one column.
template <int N>
__device__ __forceinline__ void post_mix_column(const float (&xc)[N], float u, const float (&post)[N],
                                                const float (&comb)[N * N], float (&out)[N]) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float terms[N];
#pragma unroll
        for (int i = 0; i < N; ++i) terms[i] = comb[i * N + j] * xc[i];
        out[j] = post[j] * u + tree_n<N>(terms);
    }
}

template <int VEC>
struct alignas(4 * VEC) F32Vec { float v[VEC]; };
template <int VEC>
struct alignas(2 * VEC) BF16Vec { __nv_bfloat16 v[VEC]; };

// ------------------------------------------------------------------ expand, post, head

template <int N, int D, int VEC>
__device__ __forceinline__ void hc_expand_body(const __nv_bfloat16* h, float* x) {
    static_assert(D % VEC == 0, "D must be a multiple of VEC");
    const int k0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (k0 >= D) return;
    const size_t t = blockIdx.y;
    const BF16Vec<VEC> hv = *reinterpret_cast<const BF16Vec<VEC>*>(h + t * D + k0);
    F32Vec<VEC> o;
#pragma unroll
    for (int v = 0; v < VEC; ++v) o.v[v] = bf16_to_f32(hv.v[v]);
#pragma unroll
    for (int i = 0; i < N; ++i) *reinterpret_cast<F32Vec<VEC>*>(x + (t * N + i) * D + k0) = o;
}

// Standalone post-mix with the rank sum of the partial outputs in front (x_out may alias x).
template <int N, int D, int R, int VEC>
__device__ __forceinline__ void hc_post_body(const float* x, const RankParts<R>& parts,
                                             const float* post,
                                             const float* comb, float* x_out) {
    static_assert(D % VEC == 0, "D must be a multiple of VEC");
    const int k0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (k0 >= D) return;
    const size_t t = blockIdx.y;
    float pv[N], cv[N * N];
#pragma unroll
    for (int i = 0; i < N; ++i) pv[i] = post[t * N + i];
#pragma unroll
    for (int i = 0; i < N * N; ++i) cv[i] = comb[t * N * N + i];
    F32Vec<VEC> xs[N];
#pragma unroll
    for (int i = 0; i < N; ++i) xs[i] = *reinterpret_cast<const F32Vec<VEC>*>(x + (t * N + i) * D + k0);
    F32Vec<VEC> outv[N];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        float xc[N], o[N];
#pragma unroll
        for (int i = 0; i < N; ++i) xc[i] = xs[i].v[v];
        post_mix_column<N>(xc, rank_sum<R>(parts, t * D + k0 + v), pv, cv, o);
#pragma unroll
        for (int j = 0; j < N; ++j) outv[j].v[v] = o[j];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) *reinterpret_cast<F32Vec<VEC>*>(x_out + (t * N + j) * D + k0) = outv[j];
}

template <int N, int D, int VEC>
__device__ __forceinline__ void hc_head_body(const float* x, __nv_bfloat16* y) {
    static_assert(D % VEC == 0, "D must be a multiple of VEC");
    const int k0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (k0 >= D) return;
    const size_t t = blockIdx.y;
    const float inv_n = 1.0f / (float)N;
    F32Vec<VEC> xs[N];
#pragma unroll
    for (int i = 0; i < N; ++i) xs[i] = *reinterpret_cast<const F32Vec<VEC>*>(x + (t * N + i) * D + k0);
    BF16Vec<VEC> o;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
        float xc[N];
#pragma unroll
        for (int i = 0; i < N; ++i) xc[i] = xs[i].v[v];
        o.v[v] = f32_to_bf16(tree_n<N>(xc) * inv_n);
    }
    *reinterpret_cast<BF16Vec<VEC>*>(y + t * D + k0) = o;
}


template <int N, int D, int VEC>
__global__ void hc_expand(const __nv_bfloat16* h, float* x) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    hc_expand_body<N, D, VEC>(h, x);
}

template <int N, int D, int R, int VEC>
__global__ void hc_post(const float* x, const RankParts<R> parts, const float* post,
                        const float* comb, float* x_out) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    hc_post_body<N, D, R, VEC>(x, parts, post, comb, x_out);
}

template <int N, int D, int VEC>
__global__ void hc_head(const float* x, __nv_bfloat16* y) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    hc_head_body<N, D, VEC>(x, y);
}

// ------------------------------------------------------------------ fused pre-mix + site norm

template <int N, int R, int K = 0>
struct PreParams {
    const float* x;                    // [m][N*D] streams (FUSE_POST: the streams before the post-mix)
    typename BranchOf<R, K>::type parts;  // FUSE_POST: [m][D] partial sublayer outputs per rank, or the
                                       // operands of the MoE combine that produces u (K slots)
    const float* post_in;              // FUSE_POST: [m][N] the previous site's post gates
    const float* comb_in;              // FUSE_POST: [m][N*N] the previous site's comb
    float* x_out;                      // FUSE_POST: [m][N*D] the new streams (must not alias x)
    const __nv_bfloat16* phi;          // [(2+N)N][N*D] mixing matrix
    const float* alpha;                // [3] site scales
    const float* beta;                 // [(2+N)N] mix biases
    const __nv_bfloat16* gamma;        // [D] plain RMSNorm weight
    float eps_n, eps_hc, eps;          // stream-norm, hyper-connection and RMSNorm epsilons
    int iters;                         // Sinkhorn iterations T
    float* mix;                        // [m][(2+N)N] mu (workspace, written)
    unsigned int* counters;            // [m] zero before the first launch, left zero
    __nv_bfloat16* collapsed;          // [m][D] y, or nullptr
    __nv_bfloat16* normed;             // [m][D] yhat
    float* post;                       // [m][N]
    float* comb;                       // [m][N*N], or nullptr: no gates here (hc_gates elsewhere)
    // The boundary form (glm_mhc_boundary.cuh) only; hc_pre_norm ignores them:
    const __nv_bfloat16* h;            // kSrcExpand: [m][D] the BF16 embedding row the streams start as
    unsigned int* work;                // [m][(2+N)N+2][128] hand-off slots of the partial sums (zero)
};

// Where a pre-mix's streams come from: read as they are, produced by the previous site's post-mix
// (rank sum of `parts`, post_in, comb_in applied to x), or the expand of the embedding row h.
enum StreamSource : int { kSrcStreams = 0, kSrcPost = 1, kSrcExpand = 2 };

// The N stream values at column k of token t, from the source SRC (pin, cin: kSrcPost's gates).
template <int N, int D, int SRC, class P>
__device__ __forceinline__ void stream_column(const P& p, size_t t, int k, const float (&pin)[N],
                                              const float (&cin)[N * N], float (&out)[N]) {
    if constexpr (SRC == kSrcExpand) {
        const float hv = bf16_to_f32(ld_step(p.h + t * D + k));
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = hv;
    } else {
        float xc[N];
#pragma unroll
        for (int i = 0; i < N; ++i) xc[i] = ld_step(p.x + (t * N + i) * D + k);
        if constexpr (SRC == kSrcPost) {
            float u[1];
            branch_u<1>(p.parts, D, t, k, u);
            post_mix_column<N>(xc, u[0], pin, cin, out);
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) out[i] = xc[i];
        }
    }
}

// post_i = 2 sigma(fl(fl(a1 mu_{N+i}) + beta_{N+i})).
__device__ __forceinline__ float post_gate(float mu, float a1, float b) { return 2.0f * sigmoid_f32(a1 * mu + b); }

// Post gates, softmax and Sinkhorn in one warp: lane l < N*N owns C_ij (i = l / N, j = l % N);
// lanes l < N also own post_l. Writes post (unless nullptr) and comb of token t from its mix
// outputs mu. alpha and beta may live in shared or global memory.
template <int N>
__device__ void hc_gates_warp(const float* mu, const float* alpha, const float* beta, float eps_hc,
                              int iters, float* post, float* comb, size_t t, int lane) {
    constexpr int NN = N * N;
    const int l = lane < NN ? lane : NN - 1;  // idle lanes shadow the last entry
    const int i = l / N, j = l % N;
    auto gather_row = [&](float v, float (&r)[N]) {
#pragma unroll
        for (int c = 0; c < N; ++c) r[c] = __shfl_sync(0xffffffffu, v, i * N + c);
    };
    auto gather_col = [&](float v, float (&r)[N]) {
#pragma unroll
        for (int c = 0; c < N; ++c) r[c] = __shfl_sync(0xffffffffu, v, c * N + j);
    };
    const float z = alpha[2] * mu[2 * N + l] + beta[2 * N + l];
    float r[N];
    gather_row(z, r);
    float mx = r[0];
#pragma unroll
    for (int c = 1; c < N; ++c) mx = fmaxf(mx, r[c]);
    const float e = exp_f32(z - mx);
    gather_row(e, r);
    float c = __fdiv_rn(e, tree_n<N>(r)) + eps_hc;
    gather_col(c, r);
    c = __fdiv_rn(c, eps_hc + tree_n<N>(r));  // the first column pass (iters < 1 acts as 1)
    for (int it = 1; it < iters; ++it) {
        gather_row(c, r);
        c = __fdiv_rn(c, eps_hc + tree_n<N>(r));
        gather_col(c, r);
        c = __fdiv_rn(c, eps_hc + tree_n<N>(r));
    }
    if (lane < NN) comb[t * NN + lane] = c;
    if (post != nullptr && lane < N) post[t * N + lane] = post_gate(mu[N + lane], alpha[1], beta[N + lane]);
}

// Gates + Sinkhorn alone from the mix outputs, for a side stream: the pre-mix then runs with
// comb == nullptr and its critical path ends at the normed row. grid (m), block 32.
template <int N>
__device__ __forceinline__ void hc_gates_body(const float* mix, const float* alpha,
                                              const float* beta, float eps_hc, int iters,
                                              float* post, float* comb) {
    constexpr int ROWS = (2 + N) * N;
    __shared__ float mu[ROWS];
    const size_t t = blockIdx.x;
    for (int i = threadIdx.x; i < ROWS; i += 32) mu[i] = mix[t * ROWS + i];
    __syncwarp();
    KBP_STAMP(3);   // the token's mix outputs mu loaded (then gates + Sinkhorn until the end)
    hc_gates_warp<N>(mu, alpha, beta, eps_hc, iters, post, comb, t, threadIdx.x);
}

template <int N>
__global__ void __launch_bounds__(32) hc_gates(const float* mix, const float* alpha,
                                               const float* beta, float eps_hc, int iters,
                                               float* post, float* comb) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3 in the body
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    hc_gates_body<N>(mix, alpha, beta, eps_hc, iters, post, comb);
    KBP_STAMP_END();
}

// Block-wide 256 tree over one partial per tree thread; every tree thread gets the total.
__device__ __forceinline__ float tree256_all(float partial, float* red, float* total, int tid) {
    red[tid] = partial;
    bar_tree();
    if (tid < 32) {
        const float v = tree256_warp(red, tid);
        if (tid == 0) *total = v;
    }
    bar_tree();
    return *total;
}

// Tail, tree threads: collapse with the pre gates, site RMSNorm, stores. stream(i, q, k) = x_i[k]
// for column k = tid + 256 q; ab = [alpha (3); beta] in shared memory.
template <int N, int D, class P, typename Stream>
__device__ __forceinline__ void collapse_norm(const P& p, const float* mu, const float* ab,
                                              size_t t, int tid,
                                              const float (&gam)[(D + kTreeThreads - 1) / kTreeThreads],
                                              float* red, float* total, Stream stream) {
    constexpr int QD = (D + kTreeThreads - 1) / kTreeThreads;
    // The pre gates once, in N threads, through red (free until the tree below): each is an exp in
    // double, and 256 threads computing all N of them queue on the SM's FP64 units.
    if (tid < N) red[tid] = sigmoid_f32(ab[0] * mu[tid] + ab[3 + tid]) + p.eps_hc;
    bar_tree();
    float pre[N];
#pragma unroll
    for (int i = 0; i < N; ++i) pre[i] = red[i];
    bar_tree();  // every thread has its gates before red takes the partials
    float y[QD];
    float ss = 0.0f;
#pragma unroll
    for (int q = 0; q < QD; ++q) {
        const int k = tid + kTreeThreads * q;
        float sq = 0.0f;
        y[q] = 0.0f;
        if (k < D) {
            float terms[N];
#pragma unroll
            for (int i = 0; i < N; ++i) terms[i] = pre[i] * stream(i, q, k);
            y[q] = round_bf16(tree_n<N>(terms));
            sq = y[q] * y[q];
            if (p.collapsed) p.collapsed[t * D + k] = f32_to_bf16(y[q]);
        }
        ss = q ? __fadd_rn(ss, sq) : sq;  // zero padding adds +0, as the reference's padded sum
    }
    const float r = rsqrt_f32(tree256_all(ss, red, total, tid) / (float)D + p.eps);
#pragma unroll
    for (int q = 0; q < QD; ++q) {
        const int k = tid + kTreeThreads * q;
        if (k < D) p.normed[t * D + k] = f32_to_bf16((y[q] * r) * gam[q]);
    }
}

// Main phase, tree threads: this block's mix dot product and the stream sum of squares as
// 256 strided partials each (thread t: elements t, t+256, ... of the flattened streams).
// kCache: D % 256 == 0, so a thread's elements are columns t + 256 q of every stream; it keeps
// them in xr (stream j, column q at j*QD + q) for the tail.
template <int N, int D, bool FUSE_POST, int R, bool kCache, int KPT>
__device__ __forceinline__ void mix_partials(const PreParams<N, R>& p, size_t t, int row, int tid,
                                             const float (&pin)[N], const float (&cin)[N * N],
                                             float (&xr)[kCache ? KPT : 1], float& dot, float& ss) {
    constexpr int ND = N * D;
    const __nv_bfloat16* w = p.phi + (size_t)row * ND;
    const bool writer = FUSE_POST;  // which block stores a column of x_out: q % gridDim.x == row
    if constexpr (kCache) {
        constexpr int QD = D / kTreeThreads;
        float wv[KPT];  // the HBM reads first: the streams come from L2
#pragma unroll
        for (int jj = 0; jj < KPT; ++jj) wv[jj] = bf16_to_f32(__ldg(w + tid + kTreeThreads * jj));
        // Every load before any store, so that none waits behind an x_out store it might alias.
#pragma unroll
        for (int q = 0; q < QD; ++q) {
#pragma unroll
            for (int i = 0; i < N; ++i) xr[i * QD + q] = ld_step(p.x + (t * N + i) * D + tid + kTreeThreads * q);
        }
        if constexpr (FUSE_POST) {
            float uq[QD];
#pragma unroll
            for (int q = 0; q < QD; ++q) uq[q] = rank_sum<R>(p.parts, t * D + tid + kTreeThreads * q);
#pragma unroll
            for (int q = 0; q < QD; ++q) {
                float xc[N], o[N];
#pragma unroll
                for (int i = 0; i < N; ++i) xc[i] = xr[i * QD + q];
                post_mix_column<N>(xc, uq[q], pin, cin, o);
#pragma unroll
                for (int j = 0; j < N; ++j) xr[j * QD + q] = o[j];
            }
#pragma unroll
            for (int q = 0; q < QD; ++q) {
                if (q % (int)gridDim.x != row) continue;
#pragma unroll
                for (int j = 0; j < N; ++j) p.x_out[(t * N + j) * D + tid + kTreeThreads * q] = xr[j * QD + q];
            }
        }
#pragma unroll
        for (int jj = 0; jj < KPT; ++jj) {
            const float pw = xr[jj] * wv[jj], sq = xr[jj] * xr[jj];
            dot = jj ? dot + pw : pw;
            ss = jj ? ss + sq : sq;
        }
    } else {
        for (int jj = 0; jj < KPT; ++jj) {
            const int f = tid + kTreeThreads * jj;
            float pw = 0.0f, sq = 0.0f;
            if (f < ND) {
                float v[N];
                stream_column<N, D, FUSE_POST ? kSrcPost : kSrcStreams>(p, t, f % D, pin, cin, v);
                const float xv = v[f / D];
                pw = xv * bf16_to_f32(__ldg(w + f));
                sq = xv * xv;
                if (writer && jj % (int)gridDim.x == row) p.x_out[t * ND + f] = xv;
            }
            dot = jj ? __fadd_rn(dot, pw) : pw;
            ss = jj ? __fadd_rn(ss, sq) : sq;
        }
    }
}

template <int N, int D, bool FUSE_POST, int R>
__device__ __forceinline__ void hc_pre_norm_body(const PreParams<N, R>& p) {
    constexpr int ROWS = (2 + N) * N, ND = N * D;
    constexpr int KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    constexpr bool kCache = (D % kTreeThreads == 0) && (KPT <= kMaxCachedPerThread);
    static_assert(N * N <= 32, "the Sinkhorn warp holds the N x N comb matrix");
    static_assert(ROWS <= kPreThreads, "one thread per mix row loads mu");
    __shared__ float red[2][kTreeThreads];
    __shared__ float s_mu[ROWS];
    __shared__ float s_total;
    __shared__ unsigned int s_last;
    __shared__ float s_ab[3 + ROWS];  // alpha, beta: fetched now so that the tail never waits on them
    const int tid = threadIdx.x, row = blockIdx.x;
    const size_t t = blockIdx.y;
    for (int i = tid; i < 3 + ROWS; i += kPreThreads) s_ab[i] = i < 3 ? __ldg(p.alpha + i) : __ldg(p.beta + i - 3);
    float pin[N], cin[N * N];
#pragma unroll
    for (int i = 0; i < N; ++i) pin[i] = FUSE_POST ? ld_step(p.post_in + t * N + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < N * N; ++i) cin[i] = FUSE_POST ? ld_step(p.comb_in + t * N * N + i) : 0.0f;
    float xr[kCache ? KPT : 1];
    float gam[(D + kTreeThreads - 1) / kTreeThreads];  // norm weight, loaded early: the tail must not wait
    if (tid < kTreeThreads) {
#pragma unroll
        for (int q = 0; q < (D + kTreeThreads - 1) / kTreeThreads; ++q) {
            const int k = tid + kTreeThreads * q;
            gam[q] = k < D ? bf16_to_f32(__ldg(p.gamma + k)) : 0.0f;
        }
        float dot = 0.0f, ss = 0.0f;
        mix_partials<N, D, FUSE_POST, R, kCache, KPT>(p, t, row, tid, pin, cin, xr, dot, ss);
        red[0][tid] = dot;
        red[1][tid] = ss;
        bar_tree();
        if (tid < 32) {
            const float d = tree256_warp(red[0], tid), s = tree256_warp(red[1], tid);
            if (tid == 0) {
                p.mix[t * ROWS + row] = d * rsqrt_f32(s / (float)ND + p.eps_n);
                // Release: mu is visible before the count that announces it; acquire: the last
                // block sees every mu (one atomic instead of a fence and an atomic).
                s_last = atomic_add_acq_rel_gpu(p.counters + t, 1u) == gridDim.x - 1;
            }
        }
    }
    __syncthreads();
    if (!s_last) return;
    // Last block of token t: every mu is in L2 (read it past L1); re-arm the counter.
    if (tid == 0) p.counters[t] = 0;
    if (tid < ROWS) s_mu[tid] = __ldcg(p.mix + t * ROWS + tid);
    __syncthreads();
    if (tid >= kTreeThreads) {
        if (p.comb != nullptr)  // else hc_gates runs on a side stream
            hc_gates_warp<N>(s_mu, s_ab, s_ab + 3, p.eps_hc, p.iters, p.post, p.comb, t, tid - kTreeThreads);
        return;
    }
    if constexpr (kCache) {
        constexpr int QD = D / kTreeThreads;
        collapse_norm<N, D>(p, s_mu, s_ab, t, tid, gam, red[0], &s_total,
                            [&](int i, int q, int) { return xr[i * QD + q]; });
    } else {
        collapse_norm<N, D>(p, s_mu, s_ab, t, tid, gam, red[0], &s_total, [&](int i, int, int k) {
            float v[N];
            stream_column<N, D, FUSE_POST ? kSrcPost : kSrcStreams>(p, t, k, pin, cin, v);
            return v[i];
        });
    }
}

template <int N, int D, bool FUSE_POST, int R>
__global__ void __launch_bounds__(kPreThreads, 1) hc_pre_norm(const PreParams<N, R> p) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    hc_pre_norm_body<N, D, FUSE_POST, R>(p);
}

}  // namespace mhc
}  // namespace kbp
