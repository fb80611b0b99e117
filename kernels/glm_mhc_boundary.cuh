// glm_mhc_boundary.cuh: a hyper-connection boundary in one launch (explain.families.glm_mhc): the
// previous site's post-mix (or the expand of the embedding row), the next site's pre-mix (mix GEMV,
// gates, Sinkhorn, collapse) and its RMSNorm; optionally the MoE combine (glm_moe_combine) that
// produces the post-mix's sublayer output, computed in place; and the stream mean (head) fused with
// the final RMSNorm (explain.families.rms_norm), optionally behind the last post-mix.
//
// Launch contract (N = n_hc, D = hidden, m tokens on grid.y; rows dense and 4-byte aligned, stream
// rows 8-byte aligned; a stream tensor is [m][N*D] FP32, stream i at i*D; comb is [m][N*N] with
// comb[i*N+j] = C_ij)
//   hc_boundary<N, D, SRC, R, K, RPC>(PreParams<N, R, K> p): grid (boundary_ctas(N, RPC), m), block
//     kPreThreads (288), no dynamic shared memory. SRC (StreamSource) says where the streams come
//     from: kSrcStreams p.x; kSrcPost the post-mix of p.x with u, p.post_in and p.comb_in, stored to
//     p.x_out (required; must not alias p.x); kSrcExpand p.h widened into every stream, stored to
//     p.x_out. u is the rank sum of p.parts (K == 0, R ranks) or, K > 0 (R == 1), the MoE combine
//     of K routed slots and the shared expert (p.parts is a MoeCombineIn<K>): rn_bf16 of
//     moe_combine_sums, the bytes the blend kernel would have stored. p.work holds
//     [m][(2+N)N+2][128] hand-off slots, p.counters [m] counters: both zero before the first launch
//     and left zero by every launch (graph replays find them zeroed). p.mix (mu) and p.collapsed may
//     be nullptr; with p.comb == nullptr the gates and Sinkhorn are left to hc_gates (which then
//     needs p.mix). N*D <= 81920, 1 <= RPC <= 8. The tails wait for the producers of their token, so
//     all CTAs of a token must be able to be resident at once (58 CTAs at the seed's shape).
//   hc_head_norm<N, D, THREADS, ONE_PLUS, POST, R, K>(HeadParams<N, R, K> p): grid (m), block
//     THREADS = kbpc.reference.rms_norm.block_threads(D); D even. POST: the streams are first the
//     post-mix of p.x (u as above; stored to p.x_out unless it is nullptr). p.head may be nullptr.
//
// Work split of hc_boundary (the math is glm_mhc.cuh's; every sum keeps its order). The 256 tree
// threads of every family sum fall into 8 column groups; group g is the tree threads 16g..16g+15 and
// 16g+128..16g+143 (two 32-byte runs of a Phi row), so the first tree level (t + 128 onto t) is one
// shuffle inside the group. The (2+N)N mix rows and the stream sum of squares are the chains.
//   Producers (blockIdx.x < boundary_producers): column group g x chain group rg, RPC chains each.
//     Before pdl_wait: the warp's Phi row values into registers. After: the group's stream values
//     (whole columns when D % 256 == 0, two neighbouring columns a thread, every load issued before
//     any store) into shared memory, and from chain group 0 into x_out; one warp per chain runs the
//     strided sum, folds the first level and stores its 16 level-1 values into the token's slots
//     (bits + 1 with a relaxed store: no fence, no atomic). Chain group 0's warp 8 then counts the
//     CTA's x_out stores in with one release add (the only fence, off the Sinkhorn's path).
//   Tail S (blockIdx.x == producers): spins on the comb rows' and the sum of squares' slots (relaxed
//     loads; a slot is 0 until written), finishes those trees from level 64, then one warp runs the
//     softmax + Sinkhorn and writes comb. Re-arms its slots.
//   Tail C (blockIdx.x == producers + 1): the pre and post rows and its own copy of the sum of
//     squares likewise; post gates; waits for the x_out count (acquire), reads the streams back from
//     L2, collapse + site RMSNorm. Re-arms its slots and the counter.
// PDL: every CTA releases its dependents first (they then launch only once all of this grid's CTAs
// are resident, so a tail never waits on a producer that cannot get an SM), then loads Phi, alpha,
// beta and gamma; pdl_wait() comes before the first read of an earlier kernel's output.
//
// Latency estimate (seed shape N 4, D 4096, RPC 4: 56 producers + 2 tails; H200 at ~1.8 GHz, an L2
// round trip ~0.35 us, one way ~0.2 us). The critical path after pdl_wait():
//   producers: x, u (or the K expert rows) and the gates: one L2 round trip              0.35 us
//              post-mix of 2 columns a thread, smem + x_out stores, __syncthreads           0.05 us
//              chain: 64 dependent FP32 adds + the level-1 shuffle                          0.15 us
//   hand-off:  relaxed stores land in L2, tail S's spinning loads see them                  0.35 us
//              (the last-CTA form: fence + atomic + reload, three round trips, ~1.1 us)
//   tail S:    trees from level 64 || sum of squares + rsqrt in double                      0.15 us
//              mu, softmax (exp in double)                                                  0.15 us
//              Sinkhorn: 20 x (row + column pass) x ~90 cycles (4 shuffles, tree, + eps,
//              div.rn), one warp, bit-exact, so serial                                      1.8 us
//                                                                               total    ~3.0 us
//   (the last-CTA form: ~4.5 us.) Tail C runs beside it: x_out count ~0.6 us after the loads,
//   64 KB of streams from L2 into one SM ~0.6 us, collapse + norm ~0.3 us: ~2.2 us, off the path.
//   Before pdl_wait (hidden behind the previous kernel under PDL): Phi, 16 KB a producer, ~1 us.
// Phase stamps of a profiling build (kbp_stamps.cuh): 1/2 around each role's pdl_wait; hc_boundary's
// producers 3 streams in shared memory, 4 chain slots stored; its tails (S, C) 5 slots seen, 6 output
// written; hc_head_norm 3 thread 0's columns mixed, 4 the block's sum of squares.
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
constexpr int kBoundaryWarps = kPreThreads / 32;   // 9: warp 8 of a producer releases its x_out
constexpr int kPhiPrefetch = 64;                   // Phi values a chain thread loads before pdl_wait
constexpr int kMaxBoundaryFlat = 81920;            // N*D: the CTA's stream values in shared memory
constexpr int kBoundaryTails = 2;                  // CTAs after a token's producers: tail S, tail C
constexpr long long kSpinLimit = 1LL << 24;        // polls (~5 s) before a lost hand-off traps

__host__ __device__ constexpr int boundary_chains(int n) { return (2 + n) * n + 1; }
// Hand-off slot rows per token: the mix rows, then the sum of squares once for each tail.
__host__ __device__ constexpr int boundary_slots(int n) { return boundary_chains(n) + 1; }
__host__ __device__ constexpr int boundary_producers(int n, int rows_per_cta) {
    return kColGroups * ((boundary_chains(n) + rows_per_cta - 1) / rows_per_cta);
}
__host__ __device__ constexpr int boundary_ctas(int n, int rows_per_cta) {
    return boundary_producers(n, rows_per_cta) + kBoundaryTails;
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

// ------------------------------------------------------------------ hand-off slots
// A slot holds a partial sum as its bits + 1 (a NaN first made the canonical 0x7fffffff), so a
// written slot is never 0 and 0 means "not written yet". Each slot is written once per launch by
// one producer lane and read (then zeroed) by one tail; a 32-bit relaxed access is single-copy
// atomic, so the value is there the moment the slot is non-zero, with no fence on either side.

__device__ __forceinline__ unsigned int slot_encode(float v) {
    return (isnan(v) ? 0x7fffffffu : __float_as_uint(v)) + 1u;
}
__device__ __forceinline__ float slot_decode(unsigned int s) { return __uint_as_float(s - 1u); }
__device__ __forceinline__ void slot_store(unsigned int* p, unsigned int v) { st_relaxed_gpu(p, v); }
__device__ __forceinline__ uint4 slots_load4(const unsigned int* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
// Count one writer in (release: its CTA's stores, ordered before by a __syncthreads, come first).
__device__ __forceinline__ void count_in_release(unsigned int* p) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned int count_acquire(const unsigned int* p) { return ld_acquire_gpu(p); }

// Waits for NROWS rows of slots (kLevel1 each; local row r is slot row row_of(r) of `slots`),
// decodes them into dst[r * kLevel1 + i] and zeroes them for the next launch. Thread tid takes the
// groups of 4 slots tid, tid + 288, ...: every first poll is in flight before any spin.
template <int NROWS, typename RowOf>
__device__ __forceinline__ void take_partials(unsigned int* slots, RowOf row_of, float* dst, int tid) {
    constexpr int GPR = kLevel1 / 4, GROUPS = NROWS * GPR;
    constexpr int PER = (GROUPS + kPreThreads - 1) / kPreThreads;
    unsigned int* src[PER];
    uint4 v[PER];
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        const int gi = tid + kPreThreads * s;
        src[s] = gi < GROUPS ? slots + row_of(gi / GPR) * kLevel1 + (gi % GPR) * 4 : nullptr;
        if (src[s] != nullptr) v[s] = slots_load4(src[s]);
    }
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        if (src[s] == nullptr) continue;
        for (long long n = 0; !(v[s].x && v[s].y && v[s].z && v[s].w); ++n) {
            if (n > kSpinLimit) __trap();  // a producer never wrote: a bug, never a hang
            v[s] = slots_load4(src[s]);
        }
        const int gi = tid + kPreThreads * s;
        *reinterpret_cast<float4*>(dst + (gi / GPR) * kLevel1 + (gi % GPR) * 4) =
            make_float4(slot_decode(v[s].x), slot_decode(v[s].y), slot_decode(v[s].z), slot_decode(v[s].w));
        *reinterpret_cast<uint4*>(src[s]) = make_uint4(0u, 0u, 0u, 0u);
    }
}

// ------------------------------------------------------------------ producers

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

// The previous site's post gates and comb of token t (kSrcPost; zeros otherwise), for pair_streams.
template <int N, int SRC, class P>
__device__ __forceinline__ void post_gates_in(const P& p, size_t t, float (&pin)[N], float (&cin)[N * N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) pin[i] = SRC == kSrcPost ? ld_step(p.post_in + t * N + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < N * N; ++i) cin[i] = SRC == kSrcPost ? ld_step(p.comb_in + t * N * N + i) : 0.0f;
}

// The loads of two neighbouring columns k, k + 1 of token t: xv[i] stream i's pair (kSrcExpand: the
// BF16 row widened, in xv[0]) and, for kSrcPost, uv the sublayer output u.
template <int N, int D, int SRC, class P>
__device__ __forceinline__ void pair_loads(const P& p, size_t t, int k, float2 (&xv)[N], float (&uv)[2]) {
    if constexpr (SRC == kSrcExpand) {
        xv[0] = bf16x2_load(p.h + t * D + k);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) xv[i] = ld_step(reinterpret_cast<const float2*>(p.x + (t * N + i) * D + k));
        if constexpr (SRC == kSrcPost) branch_u<2>(p.parts, D, t, k, uv);
    }
}

// The streams of those columns from their loads: o[c][i] = stream i at column k + c (kSrcPost: the
// post-mix with the previous gates pin and comb cin; otherwise as loaded).
template <int N, int SRC>
__device__ __forceinline__ void pair_streams(const float2 (&xv)[N], const float (&uv)[2], const float (&pin)[N],
                                             const float (&cin)[N * N], float (&o)[2][N]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        float xc[N];
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float2 v = xv[SRC == kSrcExpand ? 0 : i];
            xc[i] = c ? v.y : v.x;
        }
        if constexpr (SRC == kSrcPost) {
            post_mix_column<N>(xc, uv[c], pin, cin, o[c]);
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) o[c][i] = xc[i];
        }
    }
}

// The producer's stream values: xs[j * 32 + lane] = flat element tt + 256 j of the lane's tree
// thread tt (+0 past the end); with `writer` (chain group 0) also stored to x_out.
template <int N, int D, int SRC, class P>
__device__ __forceinline__ void producer_streams(const P& p, size_t t, int g, bool writer, int tid, float* xs) {
    constexpr int ND = N * D, KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    constexpr bool kStore = SRC != kSrcStreams;
    float pin[N], cin[N * N];
    post_gates_in<N, SRC>(p, t, pin, cin);
    if constexpr (D % kTreeThreads == 0) {
        // Element i QD + q of tree thread tt is stream i at column tt + 256 q. Pair pi is the
        // neighbouring columns of lanes 2c, 2c + 1 (c = pi % 16, one run) at step q = pi / 16.
        constexpr int QD = D / kTreeThreads, PAIRS = 16 * QD;
        constexpr int IT = (PAIRS + kPreThreads - 1) / kPreThreads;
        float2 xv[IT][N];
        float uv[IT][2];
#pragma unroll
        for (int it = 0; it < IT; ++it) {  // every load first
            const int pi = tid + kPreThreads * it;
            if (pi >= PAIRS) break;
            pair_loads<N, D, SRC>(p, t, group_tree_thread(g, 2 * (pi % 16)) + kTreeThreads * (pi / 16), xv[it],
                                  uv[it]);
        }
#pragma unroll
        for (int it = 0; it < IT; ++it) {
            const int pi = tid + kPreThreads * it;
            if (pi >= PAIRS) break;
            const int lane = 2 * (pi % 16), q = pi / 16;
            const int k = group_tree_thread(g, lane) + kTreeThreads * q;
            float o[2][N];
            pair_streams<N, SRC>(xv[it], uv[it], pin, cin, o);
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const float2 v = make_float2(o[0][i], o[1][i]);
                *reinterpret_cast<float2*>(xs + (i * QD + q) * 32 + lane) = v;
                if (kStore && writer) *reinterpret_cast<float2*>(p.x_out + (t * N + i) * D + k) = v;
            }
        }
    } else {
        for (int e = tid; e < 32 * KPT; e += kPreThreads) {
            const int j = e / 32, lane = e % 32;
            const int f = group_tree_thread(g, lane) + kTreeThreads * j;
            float v = 0.0f;
            if (f < ND) {
                float o[N];
                stream_column<N, D, SRC>(p, t, f % D, pin, cin, o);
                const int si = f / D;
#pragma unroll
                for (int i = 0; i < N; ++i) v = i == si ? o[i] : v;
                if (kStore && writer) p.x_out[t * ND + f] = v;
            }
            xs[j * 32 + lane] = v;
        }
    }
}

template <int N, int D, int SRC, int R, int K, int RPC>
__device__ __forceinline__ void boundary_producer(const PreParams<N, R, K>& p, int bx, int tid, float* xs) {
    constexpr int ROWS = (2 + N) * N, CHAINS = boundary_chains(N), SLOTS = boundary_slots(N), ND = N * D;
    constexpr int KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    constexpr int PF = KPT < kPhiPrefetch ? KPT : kPhiPrefetch;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = bx % kColGroups, rg = bx / kColGroups;
    const size_t t = blockIdx.y;
    const int tt = group_tree_thread(g, lane);
    const int chain = rg * RPC + warp;
    const bool has_chain = warp < RPC && chain < CHAINS;
    const __nv_bfloat16* phi = has_chain && chain < ROWS ? p.phi + (size_t)chain * ND + tt : nullptr;

    pdl_launch_dependents();
    // Weights before the dependency wait: this warp's Phi row. (Warp-uniform branch; per-load
    // predicates let ptxas sink the loads past griddepcontrol.wait.)
    __nv_bfloat16 wv[PF];
    if (phi != nullptr) {
#pragma unroll
        for (int j = 0; j < PF; ++j) {
            wv[j] = ND % kTreeThreads == 0 || tt + kTreeThreads * j < ND ? __ldg(phi + kTreeThreads * j)
                                                                       : __float2bfloat16_rn(0.0f);
        }
    } else {
#pragma unroll
        for (int j = 0; j < PF; ++j) wv[j] = __float2bfloat16_rn(0.0f);
    }
    KBP_STAMP(kStampWaitIn);
    pdl_wait();
    KBP_STAMP(kStampWaitOut);

    producer_streams<N, D, SRC>(p, t, g, rg == 0, tid, xs);
    __syncthreads();
    KBP_STAMP(3);   // producer: the group's streams loaded into shared memory (and x_out stored)
    if (has_chain) {
        const float v = boundary_chain<ND, KPT, PF>(xs, wv, phi, tt, lane);
        if (lane < 16) {
            unsigned int* slot = p.work + (t * SLOTS + chain) * kLevel1 + 16 * g + lane;
            const unsigned int s = slot_encode(v);
            slot_store(slot, s);
            if (chain == ROWS) slot_store(slot + kLevel1, s);  // the sum of squares: one copy per tail
        }
    } else if (SRC == kSrcPost && rg == 0 && warp == kBoundaryWarps - 1 && lane == 0) {
        count_in_release(p.counters + t);  // this CTA's x_out stores, for tail C
    }
    KBP_STAMP(4);   // producer: warp 0's chain summed and its level-1 slots stored
}

// ------------------------------------------------------------------ tails

// Tail S: mu of the comb rows, then softmax + Sinkhorn (if p.comb) in warp 0.
template <int N, int D, int R, int K>
__device__ __forceinline__ void boundary_sinkhorn_tail(const PreParams<N, R, K>& p, int tid, float* part, float* ab,
                                                       float* mu, float* dot, float* r_out) {
    constexpr int ROWS = (2 + N) * N, SLOTS = boundary_slots(N), NN = N * N, FIRST = 2 * N;
    const int warp = tid >> 5, lane = tid & 31;
    const size_t t = blockIdx.y;
    pdl_launch_dependents();
    for (int i = tid; i < 3 + ROWS; i += kPreThreads) ab[i] = i < 3 ? __ldg(p.alpha + i) : __ldg(p.beta + i - 3);
    KBP_STAMP(kStampWaitIn);
    pdl_wait();
    KBP_STAMP(kStampWaitOut);
    // Slot rows 2N .. ROWS: the comb rows, then the sum of squares.
    take_partials<NN + 1>(p.work + (t * SLOTS + FIRST) * kLevel1, [](int r) { return r; }, part, tid);
    __syncthreads();
    KBP_STAMP(5);   // tail S: every comb-row and sum-of-squares slot seen (after the spin)
    if (warp == kBoundaryWarps - 1) {
        const float* v = part + NN * kLevel1;
        const float ss = tree_from_level1(v[lane], v[lane + 32], v[lane + 64], v[lane + 96]);
        if (lane == 0) *r_out = rsqrt_f32(ss / (float)(N * D) + p.eps_n);
    } else {
        for (int row = warp; row < NN; row += kBoundaryWarps - 1) {
            const float* v = part + row * kLevel1;
            const float d = tree_from_level1(v[lane], v[lane + 32], v[lane + 64], v[lane + 96]);
            if (lane == 0) dot[row] = d;
        }
    }
    __syncthreads();
    if (warp != 0) return;
    const float r = *r_out;
    for (int m = lane; m < NN; m += 32) {
        mu[FIRST + m] = dot[m] * r;
        if (p.mix) p.mix[t * ROWS + FIRST + m] = dot[m] * r;
    }
    __syncwarp();
    if (p.comb != nullptr) hc_gates_warp<N>(mu, ab, ab + 3, p.eps_hc, p.iters, nullptr, p.comb, t, lane);
    KBP_STAMP(6);   // tail S: mu written and (with p.comb) softmax + Sinkhorn done, comb written
}

// Tail C: mu of the pre and post rows, the post gates (if p.comb), collapse and site RMSNorm.
template <int N, int D, int SRC, int R, int K>
__device__ __forceinline__ void boundary_collapse_tail(const PreParams<N, R, K>& p, int tid, float* part, float* ab,
                                                       float* mu, float* dot, float* r_out, float* red,
                                                       float* total) {
    constexpr int ROWS = (2 + N) * N, SLOTS = boundary_slots(N), QD = (D + kTreeThreads - 1) / kTreeThreads;
    constexpr bool kCache = D % kTreeThreads == 0 && N * QD <= kMaxCachedPerThread / 2;
    constexpr int kCached = kCache ? (SRC == kSrcExpand ? QD : N * QD) : 1;
    const int warp = tid >> 5, lane = tid & 31;
    const bool tree = tid < kTreeThreads;
    const size_t t = blockIdx.y;
    pdl_launch_dependents();
    for (int i = tid; i < 3 + ROWS; i += kPreThreads) ab[i] = i < 3 ? __ldg(p.alpha + i) : __ldg(p.beta + i - 3);
    float gam[QD];  // the norm weight, before the wait (warp-uniform branch, as the producers' Phi)
    if (tree) {
#pragma unroll
        for (int q = 0; q < QD; ++q) {
            const int k = tid + kTreeThreads * q;
            gam[q] = D % kTreeThreads == 0 || k < D ? bf16_to_f32(__ldg(p.gamma + k)) : 0.0f;
        }
    } else {
#pragma unroll
        for (int q = 0; q < QD; ++q) gam[q] = 0.0f;
    }
    KBP_STAMP(kStampWaitIn);
    pdl_wait();
    KBP_STAMP(kStampWaitOut);
    auto load = [&](int i, int k) -> float {
        if constexpr (SRC == kSrcExpand) return bf16_to_f32(ld_step(p.h + t * D + k));
        else if constexpr (SRC == kSrcPost) return __ldcg(p.x_out + (t * N + i) * D + k);  // the producers' stores
        else return ld_step(p.x + (t * N + i) * D + k);
    };
    float xr[kCached];
    auto cache = [&] {
        if constexpr (kCache) {
            if (tree) {
#pragma unroll
                for (int e = 0; e < kCached; ++e) xr[e] = load(e / QD, tid + kTreeThreads * (e % QD));
            }
        }
    };
    if constexpr (SRC != kSrcPost) cache();  // inputs of earlier kernels: now
    // Slot rows 0 .. 2N-1 (pre, post) and ROWS + 1 (this tail's sum of squares).
    take_partials<2 * N + 1>(p.work + t * SLOTS * kLevel1, [](int r) { return r < 2 * N ? r : ROWS + 1; }, part,
                             tid);
    if constexpr (SRC == kSrcPost) {
        if (tid == 0) {
            for (long long n = 0; count_acquire(p.counters + t) < (unsigned int)kColGroups; ++n) {
                if (n > kSpinLimit) __trap();
            }
        }
    }
    __syncthreads();
    KBP_STAMP(5);   // tail C: its slots seen and (kSrcPost) the x_out count complete
    if constexpr (SRC == kSrcPost) cache();  // every writer's x_out is visible now
    if (warp == kBoundaryWarps - 1) {
        const float* v = part + 2 * N * kLevel1;
        const float ss = tree_from_level1(v[lane], v[lane + 32], v[lane + 64], v[lane + 96]);
        if (lane == 0) *r_out = rsqrt_f32(ss / (float)(N * D) + p.eps_n);
    } else {
        for (int row = warp; row < 2 * N; row += kBoundaryWarps - 1) {
            const float* v = part + row * kLevel1;
            const float d = tree_from_level1(v[lane], v[lane + 32], v[lane + 64], v[lane + 96]);
            if (lane == 0) dot[row] = d;
        }
    }
    __syncthreads();
    if (tid < 2 * N) {
        const float m = dot[tid] * *r_out;
        mu[tid] = m;
        if (p.mix) p.mix[t * ROWS + tid] = m;
        if (tid >= N && p.comb != nullptr) p.post[t * N + tid - N] = post_gate(m, ab[1], ab[3 + tid]);
    }
    if (SRC == kSrcPost && tid == 0) p.counters[t] = 0;  // every writer has counted: re-arm
    __syncthreads();
    if (!tree) return;
    if constexpr (kCache) {
        collapse_norm<N, D>(p, mu, ab, t, tid, gam, red, total, [&](int i, int q, int) {
            return xr[SRC == kSrcExpand ? q : i * QD + q];
        });
    } else {
        collapse_norm<N, D>(p, mu, ab, t, tid, gam, red, total, [&](int i, int, int k) { return load(i, k); });
    }
    KBP_STAMP(6);   // tail C: collapse + site RMSNorm done (thread 0's columns stored)
}

template <int N, int D, int SRC, int R, int K, int RPC>
__device__ __forceinline__ void hc_boundary_body(const PreParams<N, R, K>& p) {
    constexpr int ROWS = (2 + N) * N, ND = N * D, KPT = (ND + kTreeThreads - 1) / kTreeThreads;
    constexpr int TAIL_ROWS = N * N + 1 > 2 * N + 1 ? N * N + 1 : 2 * N + 1;
    constexpr int SMEM = KPT * 32 > TAIL_ROWS * kLevel1 ? KPT * 32 : TAIL_ROWS * kLevel1;
    constexpr int P = boundary_producers(N, RPC);
    static_assert(N * N <= 32, "the Sinkhorn warp holds the N x N comb matrix");
    static_assert(RPC >= 1 && RPC < kBoundaryWarps, "one warp per chain; warp 8 releases x_out");
    static_assert(ND <= kMaxBoundaryFlat, "the CTA's stream values live in shared memory");
    static_assert(K == 0 || R == 1, "a fused MoE combine is one rank's output");
    __shared__ __align__(16) float smem[SMEM];  // a producer's stream values, or a tail's partials
    __shared__ float s_ab[3 + ROWS];
    __shared__ float s_mu[ROWS];
    __shared__ float s_dot[TAIL_ROWS];
    __shared__ float red[kTreeThreads];
    __shared__ float s_total, s_r;
    const int bx = blockIdx.x, tid = threadIdx.x;
    if (bx < P) boundary_producer<N, D, SRC, R, K, RPC>(p, bx, tid, smem);
    else if (bx == P) boundary_sinkhorn_tail<N, D, R, K>(p, tid, smem, s_ab, s_mu, s_dot, &s_r);
    else boundary_collapse_tail<N, D, SRC, R, K>(p, tid, smem, s_ab, s_mu, s_dot, &s_r, red, &s_total);
}

template <int N, int D, int SRC, int R, int K, int RPC>
__global__ void __launch_bounds__(kPreThreads, 1) hc_boundary(const PreParams<N, R, K> p) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3-6 in the roles
    hc_boundary_body<N, D, SRC, R, K, RPC>(p);
    KBP_STAMP_END();
}

// ------------------------------------------------------------------ head + final RMSNorm

template <int N, int R, int K = 0>
struct HeadParams {
    const float* x;                 // [m][N*D] streams (POST: before the last post-mix)
    typename BranchOf<R, K>::type parts;  // POST: partial sublayer outputs [m][D] per rank, or the
                                    // MoE combine that produces u (K slots)
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
template <int N, int D, int THREADS, bool ONE_PLUS, bool POST, int R, int K = 0>
__device__ __forceinline__ void hc_head_norm_body(const HeadParams<N, R, K>& p) {
    static_assert(D % 2 == 0 && THREADS % 32 == 0 && THREADS <= 1024, "pairs over whole warps");
    static_assert(K == 0 || R == 1, "a fused MoE combine is one rank's output");
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
    KBP_STAMP(kStampWaitIn);
    pdl_wait();
    KBP_STAMP(kStampWaitOut);
    pdl_launch_dependents();
    float pin[N], cin[N * N];
#pragma unroll
    for (int i = 0; i < N; ++i) pin[i] = POST ? ld_step(p.post_in + t * N + i) : 0.0f;
#pragma unroll
    for (int i = 0; i < N * N; ++i) cin[i] = POST ? ld_step(p.comb_in + t * N * N + i) : 0.0f;
    const float inv_n = 1.0f / (float)N;
    float2 h[PER];
    float partial = 0.0f;
#pragma unroll
    for (int s = 0; s < PER; ++s) {
        const int pr = tid + s * THREADS;
        if (pr >= PAIRS) break;
        float hv[2], u[2];
        if constexpr (POST) branch_u<2, false>(p.parts, D, t, 2 * pr, u);   // 1024 threads: 64 registers
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int k = 2 * pr + e;
            float xc[N], o[N];
#pragma unroll
            for (int i = 0; i < N; ++i) xc[i] = ld_step(p.x + (t * N + i) * D + k);
            if constexpr (POST) {
                post_mix_column<N>(xc, u[e], pin, cin, o);
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
    KBP_STAMP(3);   // thread 0's columns read, post-mixed (x_out) and head stored
    const float ss = rms_block_sum<THREADS>(partial, warp_sums);
    KBP_STAMP(4);   // the block's sum of squares met
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

template <int N, int D, int THREADS, bool ONE_PLUS, bool POST, int R, int K = 0>
__global__ void __launch_bounds__(THREADS) hc_head_norm(const HeadParams<N, R, K> p) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3, 4 in the body
    hc_head_norm_body<N, D, THREADS, ONE_PLUS, POST, R, K>(p);
    KBP_STAMP_END();
}

}  // namespace mhc
}  // namespace kbp
