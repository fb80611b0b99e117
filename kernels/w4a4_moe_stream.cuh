// w4a4_moe_stream.cuh: the routed-expert W4A4 slot GEMV as a persistent weight stream (the engine
// of glm_moe_layer.cuh's two kernels; family w4a4_mx_static, exact variant e2m1_dp4a_exact).
//
// Launch contract: none (device building blocks). A kernel using them runs 256-thread CTAs and
// gives moe_pipeline a dynamic shared-memory ring of STAGES * MOE_STAGE_BYTES bytes.
// Work: an ITEM is (slot s, tile t, part p): the 32 weight rows of tile t of slot s's expert, over
//   the K range of part p (P parts, P in 1, 2, 4, 8). Items are claimed one at a time from a global
//   counter (dynamic: any grid size works and no CTA ever waits on a CTA that has not started).
//   A STAGE is one item's rows over 8 consecutive 128-wide chunks (one per warp class), copied
//   global -> shared with cp.async (16-byte, coalesced: a warp copies 512 contiguous bytes) into a
//   STAGES-deep ring, so the copies of the next STAGES-1 stages are in flight while one computes.
// Math (bit-exact with kbpc.reference.w4a4_mx.w4a4_gemv, the slot GEMV's order): the 128-wide
//   chunks c of a row belong to class c mod 8; part p owns the classes p*8/P .. (p+1)*8/P-1. Warp w
//   of the CTA takes class p*8/P + (w mod 8/P) for rows (w div 8/P)*32/P + lane/P; the P lanes of a
//   row split each chunk's 8 groups (group dot products of signed 2q x 2a bytes by DP4A, exact;
//   times the exact FP32 scale product, summed in FP64: exact in any order, so the split is free),
//   then every chunk is folded into the class accumulator with one rounding, acc = f32(acc + S_c),
//   in increasing c. moe_tile_sum adds the 8 class accumulators of a row in class order (the P
//   parts' classes meet through global memory, last arriver sums), so the bits never depend on P,
//   on the grid or on which CTA ran what.
// Ordering: every cross-CTA hand-off is release (the writers' stores, a CTA or warp barrier, then
//   one thread's __threadfence and atomic: the fence is cumulative over what the barrier ordered
//   before it) / acquire (the atomic's result, __threadfence, barrier, ld.global.cg), and the last
//   arriver resets its counter for the next launch. State lives in the instantiating TU
//   (zero-initialised device memory).
#pragma once

#include "w4a4_mx.cuh"

namespace kbp {

constexpr int MOE_THREADS = 256;
constexpr int MOE_ROWS = 32;                      // weight rows per item: one per lane
constexpr int MOE_SPAN = 8;                       // chunks per stage: one per warp class
constexpr int MOE_CODE_ROW = MOE_SPAN * 64 + 16;  // a row's codes in a stage, +16 B: LDS.128 conflict-free
constexpr int MOE_SCALE_ROW = MOE_SPAN * 8 + 8;   // a row's 64 scale bytes, +8 B: LDS.64 conflict-free
constexpr int MOE_STAGE_BYTES = MOE_ROWS * (MOE_CODE_ROW + MOE_SCALE_ROW);
constexpr int MOE_NONE = -1;                      // "no item" in the stage metadata
// Warps 1..7 issue the ring's copies; warp 0 never has a cp.async in flight, so its fences (it
// releases every cross-CTA hand-off and runs the epilogues) never wait for a weight stream.
constexpr int MOE_COPY_THREAD0 = 32, MOE_COPY_THREADS = MOE_THREADS - MOE_COPY_THREAD0;
constexpr long long MOE_SPIN_LIMIT = 1LL << 24;   // ~10 s of waiting is a bug: trap, never hang

// ------------------------------------------------------------------ memory helpers

// (cp_async16 / cp_async8 / cp_async_commit / cp_async_wait: kbp_common.cuh)

// (ld_acquire_gpu / st_release_gpu: kbp_common.cuh)

// Thread 0 waits until *flag != 0 (then the whole CTA proceeds). Bounded: traps on a lost flag.
__device__ __forceinline__ void cta_wait_flag(const unsigned* flag) {
    if (threadIdx.x == 0) {
        long long n = 0;
        while (ld_acquire_gpu(flag) == 0) {
            __nanosleep(128);
            if (++n > MOE_SPIN_LIMIT) __trap();
        }
        __threadfence();
    }
    __syncthreads();
}

// Claim the next index of a global work counter for the whole CTA (every thread gets it).
__device__ __forceinline__ int cta_claim(unsigned* counter, int* slot) {
    if (threadIdx.x == 0) *slot = (int)atomicAdd(counter, 1u);
    __syncthreads();
    const int v = *slot;
    __syncthreads();  // the slot may be rewritten by the next claim
    return v;
}

// Prefetch this CTA's 1/gridDim share of [p, p + bytes) into L2.
__device__ __forceinline__ void prefetch_l2_share(const void* p, size_t bytes) {
    if (p == nullptr || bytes == 0) return;
    const size_t share = ((bytes + gridDim.x - 1) / gridDim.x + 127) & ~(size_t)127;
    const size_t lo = share * blockIdx.x;
    if (lo < bytes) prefetch_l2(static_cast<const char*>(p) + lo, min(share, bytes - lo), threadIdx.x, MOE_THREADS);
}

// ------------------------------------------------------------------ activations

// A staged activation group: signed bytes 2a and -2a (so the weight's negative codes need no
// subtraction: dp4a(|2q| of the positive codes, 2a) + dp4a(|2q| of the negative codes, -2a)).
struct MoeActGroup {
    uint4 pos, neg;
};
constexpr int MOE_ACT_BYTES = sizeof(MoeActGroup) + sizeof(float);  // a staged group and its scale

// Decode one NVFP4 group (8 code bytes, 1 scale byte) into its staged form and scale.
__device__ __forceinline__ void moe_stage_group(uint2 w, uint8_t sc, MoeActGroup* a, float* s) {
    const uint2 n = make_uint2(w.x ^ 0x88888888u, w.y ^ 0x88888888u);  // sign bits flipped: -a
    a->pos = make_uint4(e2m1x2_signed(w.x), e2m1x2_signed(w.x >> 16), e2m1x2_signed(w.y), e2m1x2_signed(w.y >> 16));
    a->neg = make_uint4(e2m1x2_signed(n.x), e2m1x2_signed(n.x >> 16), e2m1x2_signed(n.y), e2m1x2_signed(n.y >> 16));
    *s = e4m3_to_f32(sc);
}

// Stage `groups` quantized groups (codes 8 bytes and a scale byte each, read through L2: they may
// have been written by another CTA of this grid). No barrier inside.
__device__ __forceinline__ void moe_stage_rows(const uint8_t* codes, const uint8_t* scales, int groups,
                                               MoeActGroup* a, float* s) {
    for (int j = threadIdx.x; j < groups; j += MOE_THREADS) {
        const uint2 w = __ldcg(reinterpret_cast<const uint2*>(codes) + j);
        moe_stage_group(w, __ldcg(scales + j), a + j, s + j);
    }
}

// 4 * sum of the 16 products q*a of one group: the weight's code words w0, w1 against a staged group.
__device__ __forceinline__ int moe_dot16(uint32_t w0, uint32_t w1, const MoeActGroup& a) {
    const uint32_t n0 = w0 ^ 0x88888888u, n1 = w1 ^ 0x88888888u;
    int d = __dp4a((int)e2m1x2_pos(w0), (int)a.pos.x, 0);
    d = __dp4a((int)e2m1x2_pos(n0), (int)a.neg.x, d);  // n0's positive codes are w0's negative ones
    d = __dp4a((int)e2m1x2_pos(w0 >> 16), (int)a.pos.y, d);
    d = __dp4a((int)e2m1x2_pos(n0 >> 16), (int)a.neg.y, d);
    d = __dp4a((int)e2m1x2_pos(w1), (int)a.pos.z, d);
    d = __dp4a((int)e2m1x2_pos(n1), (int)a.neg.z, d);
    d = __dp4a((int)e2m1x2_pos(w1 >> 16), (int)a.pos.w, d);
    return __dp4a((int)e2m1x2_pos(n1 >> 16), (int)a.neg.w, d);
}

// ------------------------------------------------------------------ one stage

template <int K, int P>
struct MoeGeom {
    static_assert(K % 128 == 0, "W4A4 walks K in 128-wide chunks");
    static_assert(P == 1 || P == 2 || P == 4 || P == 8, "K parts: 1, 2, 4 or 8");
    static constexpr int NCH = K / 128;            // chunks of a row
    static constexpr int NST = (NCH + 7) / 8;      // stages of an item
    static constexpr int CPW = 8 / P;              // classes of an item
    static constexpr int GPL = 8 / P;              // groups of a chunk per lane
    static constexpr int RPS = 32 / P;             // rows of a row subset
};

// Issue the copies of stage `sub` of an item: rows row(0..31) of an expert's codes (K/2 bytes a
// row) and scales (K/16 a row), chunks 8*sub + p*CPW .. of them. Called by all threads (warps
// 1..7 copy); no commit.
template <int K, int P, class RowOf>
__device__ __forceinline__ void moe_issue_stage(uint8_t* st, const uint8_t* wc, const uint8_t* ws, RowOf row,
                                                int sub, int part) {
    using G = MoeGeom<K, P>;
    const int c0 = 8 * sub + part * G::CPW;
    const int nch = min(G::CPW, G::NCH - c0);
    if (nch <= 0) return;
    constexpr int VPR = G::CPW * 4;  // 16-byte vectors of a row in a stage
    const int first = (int)threadIdx.x - MOE_COPY_THREAD0;
    if (first < 0) return;
    for (int v = first; v < MOE_ROWS * VPR; v += MOE_COPY_THREADS) {
        const int r = v / VPR, col = v % VPR;
        if (col < nch * 4)
            cp_async16(st + r * MOE_CODE_ROW + col * 16, wc + (size_t)row(r) * (K / 2) + c0 * 64 + col * 16);
    }
    uint8_t* ss = st + MOE_ROWS * MOE_CODE_ROW;
    for (int v = first; v < MOE_ROWS * G::CPW; v += MOE_COPY_THREADS) {
        const int r = v / G::CPW, ch = v % G::CPW;
        if (ch < nch) cp_async8(ss + r * MOE_SCALE_ROW + ch * 8, ws + (size_t)row(r) * (K / 16) + (c0 + ch) * 8);
    }
}

// Exact sum of the scaled group products of N consecutive groups (codes 8 bytes each at `codes`,
// activation groups g0.., weight scale bytes of `sw` from byte b0): FP64 4 * sum(q a s^w s^a).
template <int N>
__device__ __forceinline__ double moe_groups(const uint8_t* codes, const MoeActGroup* act, const float* act_s,
                                             uint2 sw, int g0, int b0) {
    static_assert(N == 1 || N % 2 == 0, "groups are loaded in pairs (16 bytes) or alone");
    double s = 0.0;
#pragma unroll
    for (int i = 0; i < N; i += 2) {
        uint32_t wv[4];
        if constexpr (N >= 2) {
            const uint4 cw = *reinterpret_cast<const uint4*>(codes + 8 * i);
            wv[0] = cw.x; wv[1] = cw.y; wv[2] = cw.z; wv[3] = cw.w;
        } else {
            const uint2 cw = *reinterpret_cast<const uint2*>(codes);
            wv[0] = cw.x; wv[1] = cw.y; wv[2] = wv[3] = 0u;
        }
#pragma unroll
        for (int h = 0; h < (N >= 2 ? 2 : 1); ++h) {
            const int g = g0 + i + h, b = b0 + i + h;
            const int d = moe_dot16(wv[2 * h], wv[2 * h + 1], act[g]);
            const uint32_t sb = (b < 4 ? sw.x >> (8 * b) : sw.y >> (8 * (b - 4))) & 0xffu;
            const float sc = __fmul_rn(e4m3_to_f32((uint8_t)sb), act_s[g]);
            s = __dadd_rn(s, (double)__fmul_rn((float)d, sc));  // exact: 12 x 8 significant bits
        }
    }
    return s;
}

// Fold this lane's share of stage `sub` into its class accumulator. act / act_s: the item's
// activation row (K/16 groups). Warp-uniform early out for classes with no chunk here.
template <int K, int P>
__device__ __forceinline__ float moe_compute_stage(const uint8_t* st, const MoeActGroup* act, const float* act_s,
                                                   int sub, int part, float acc) {
    using G = MoeGeom<K, P>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wl = warp % G::CPW, c = 8 * sub + part * G::CPW + wl;
    if (c >= G::NCH) return acc;
    const int r = (warp / G::CPW) * G::RPS + lane / P, sb = lane % P;
    const uint8_t* rowc = st + r * MOE_CODE_ROW + wl * 64 + sb * G::GPL * 8;
    const uint2 sw = *reinterpret_cast<const uint2*>(st + MOE_ROWS * MOE_CODE_ROW + r * MOE_SCALE_ROW + wl * 8);
    double s = moe_groups<G::GPL>(rowc, act, act_s, sw, c * 8 + sb * G::GPL, sb * G::GPL);
#pragma unroll
    for (int off = 1; off < P; off <<= 1) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));  // exact
    return add_f32_exact(acc, 0.25 * s);
}

// This thread's (class, row) of an item, and whether it holds the row's accumulator (sub-lane 0).
template <int K, int P>
__device__ __forceinline__ int moe_lane_class(int part) { return part * MoeGeom<K, P>::CPW + (threadIdx.x >> 5) % MoeGeom<K, P>::CPW; }
template <int K, int P>
__device__ __forceinline__ int moe_lane_row() {
    return ((threadIdx.x >> 5) / MoeGeom<K, P>::CPW) * MoeGeom<K, P>::RPS + (threadIdx.x & 31) / P;
}

// ------------------------------------------------------------------ the class sum of a tile

// After an item's last stage (all threads): the tile's 8 class accumulators of each of its 32 rows
// meet; returns true in every thread of the CTA that completes the tile, and then warp 0's lane r
// holds row r's sum in class order in `p`. P == 1: through shared `part` [8][32]; P > 1: through
// the tile's global `gpart` [8][32] and arrival counter `cnt` (the P-th arriver sums, resets cnt).
template <int K, int P>
__device__ __forceinline__ bool moe_tile_sum(float acc, int part_idx, float (*part)[32], float* gpart,
                                             unsigned* cnt, int* flag, float& p) {
    const int cls = moe_lane_class<K, P>(part_idx), r = moe_lane_row<K, P>();
    if ((threadIdx.x & 31) % P == 0) {
        if constexpr (P == 1) part[cls][r] = acc;
        else gpart[cls * 32 + r] = acc;
    }
    bool last = true;
    if constexpr (P > 1) {
        __syncthreads();  // the CTA's partials are written; thread 0 releases them (cumulative fence)
        if (threadIdx.x == 0) {
            __threadfence();
            const bool l = atomicAdd(cnt, 1u) == (unsigned)(P - 1);
            if (l) *cnt = 0u;  // every part has arrived: ready for the next launch
            __threadfence();   // acquire: the other parts' partials are visible to this CTA
            *flag = l;
        }
        __syncthreads();
        last = *flag != 0;
    } else {
        __syncthreads();
    }
    if (last && threadIdx.x < 32) {
        float v = P == 1 ? part[0][threadIdx.x] : __ldcg(gpart + threadIdx.x);
#pragma unroll
        for (int w = 1; w < 8; ++w) v = __fadd_rn(v, P == 1 ? part[w][threadIdx.x] : __ldcg(gpart + w * 32 + threadIdx.x));
        p = v;
    }
    return last;
}

// ------------------------------------------------------------------ the pipeline

// Shared state of the pipeline (besides the ring).
template <int STAGES>
struct MoePipeSmem {
    int pend_item[2], pend_e[2];       // claimed items, double-buffered by transition parity
    int meta_item[STAGES], meta_sub[STAGES], meta_e[STAGES];
    int flag;
    float part[8][32];
};

// Runs every item of a claim counter through the ring (all threads of the CTA).
//   claim():      thread 0 only: the next item index (>= total: none left)
//   expert(i):    thread 0 only: item i's expert id (< 0: an empty slot: no loads, acc stays +0)
//   issue(buf, i, e, sub):  all threads: the copies of stage sub of item i (expert e >= 0)
//   compute(buf, i, e, sub, acc) -> acc:  all threads, e >= 0
//   finish(i, e, acc):  all threads, after the item's last stage (may synchronize the CTA)
template <int NST, int STAGES, class Claim, class Expert, class Issue, class Compute, class Finish>
__device__ __forceinline__ void moe_pipeline(uint8_t* ring, MoePipeSmem<STAGES>& ps, int total, Claim claim,
                                             Expert expert, Issue issue, Compute compute, Finish finish) {
    static_assert(STAGES >= 2, "a ring of at least two stages");
    const int tid = threadIdx.x;
    if (tid == 0) {
        const int i = claim();
        ps.pend_item[0] = i;
        ps.pend_e[0] = i < total ? expert(i) : -1;
    }
    __syncthreads();
    int is_item = 0, is_e = -1, is_sub = NST, tr = 0;  // issue side: forces a transition first
    auto issue_next = [&](int q) {
        if (is_item != MOE_NONE && is_sub == NST) {  // next item (CTA-uniform)
            is_item = ps.pend_item[tr & 1];
            is_e = ps.pend_e[tr & 1];
            is_sub = 0;
            ++tr;
            if (is_item >= total) is_item = MOE_NONE;
            else if (tid == 0) {  // claim the item after it; read at the next transition, after a barrier
                const int i = claim();
                ps.pend_item[tr & 1] = i;
                ps.pend_e[tr & 1] = i < total ? expert(i) : -1;
            }
        }
        const int slot = q % STAGES;
        if (tid == 0) {
            ps.meta_item[slot] = is_item;
            ps.meta_sub[slot] = is_sub;
            ps.meta_e[slot] = is_e;
        }
        if (is_item != MOE_NONE) {
            if (is_e >= 0) issue(ring + (size_t)slot * MOE_STAGE_BYTES, is_item, is_e, is_sub);
            ++is_sub;
        }
        cp_async_commit();  // one group per stage, empty or not: the wait counts stay uniform
    };
    for (int q = 0; q < STAGES - 1; ++q) {
        issue_next(q);
        __syncthreads();  // a transition's claim is published before the next one reads it
    }
    float acc = 0.0f;
    for (int q = 0;; ++q) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of stage q have landed
        __syncthreads();              // everyone's have; the slot of stage q-1 is free again
        issue_next(q + STAGES - 1);
        const int slot = q % STAGES, item = ps.meta_item[slot], sub = ps.meta_sub[slot], e = ps.meta_e[slot];
        if (item == MOE_NONE) break;
        if (sub == 0) acc = 0.0f;
        if (e >= 0) acc = compute(ring + (size_t)slot * MOE_STAGE_BYTES, item, e, sub, acc);
        if (sub == NST - 1) finish(item, e, acc);
    }
    cp_async_wait<0>();
    __syncthreads();
}

// Every routed item (slot s, tile t, part p; item = (t * S + s) * P + p) of a claim counter through
// the pipeline. Slot s's expert e = ids[s] (read through L2) has rows_per_expert rows of K values
// at w_codes / w_scales; row_of(t, r) is the expert row of the tile's lane-row r; act_row(s) the
// staged activation row of the slot; gpart / cnt the P > 1 tiles' class partials and counters
// ([S*T][256], [S*T]). On warp 0 of the CTA completing tile t of slot s: epilogue(s, t, sum,
// scale), sum the row's class-ordered FP32 sum, scale = f32(gamma * w_sg[e]) (0 for an empty slot).
template <int K, int P, int STAGES, int S, int T, class RowOf, class ActRow, class Epilogue>
__device__ __forceinline__ void moe_routed_items(uint8_t* ring, MoePipeSmem<STAGES>& ps, unsigned* claim_ctr,
                                                 const int* ids, const uint8_t* w_codes, const uint8_t* w_scales,
                                                 size_t rows_per_expert, const float* w_sg, float gamma,
                                                 const MoeActGroup* act, const float* act_s, float* gpart,
                                                 unsigned* cnt, RowOf row_of, ActRow act_row, Epilogue epilogue) {
    using G = MoeGeom<K, P>;
    auto slot = [](int i) { return (i / P) % S; };
    auto tile = [](int i) { return i / (P * S); };
    auto claim = [&]() { return (int)atomicAdd(claim_ctr, 1u); };
    auto expert = [&](int i) { return __ldcg(ids + slot(i)); };
    auto issue = [&](uint8_t* buf, int i, int e, int sub) {
        const int t = tile(i);
        const size_t rows = (size_t)e * rows_per_expert;
        moe_issue_stage<K, P>(buf, w_codes + rows * (K / 2), w_scales + rows * (K / 16),
                              [&](int r) { return row_of(t, r); }, sub, i % P);
    };
    auto compute = [&](const uint8_t* buf, int i, int, int sub, float acc) {
        const int row = act_row(slot(i));
        return moe_compute_stage<K, P>(buf, act + row * (K / 16), act_s + row * (K / 16), sub, i % P, acc);
    };
    auto finish = [&](int i, int e, float acc) {
        const int s = slot(i), t = tile(i), tile_id = s * T + t;
        float sum = 0.0f;
        if (moe_tile_sum<K, P>(acc, i % P, ps.part, P > 1 ? gpart + (size_t)tile_id * 256 : nullptr,
                               P > 1 ? cnt + tile_id : nullptr, &ps.flag, sum) &&
            threadIdx.x < 32)
            epilogue(s, t, sum, e >= 0 ? __fmul_rn(gamma, __ldg(w_sg + e)) : 0.0f);
    };
    moe_pipeline<G::NST, STAGES>(ring, ps, T * S * P, claim, expert, issue, compute, finish);
}

}  // namespace kbp
