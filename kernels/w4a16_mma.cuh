// w4a16_mma.cuh: NVFP4-weight x BF16-activation one-row GEMV on FP16 tensor cores: the `fast`
// numerics form of family w4a16_gemv (mma.sync m16n8k16, FP32 accumulation; sm_80+).
//
// Weight format as w4a16_gemv.cuh (codes (N, K/2), E4M3 scales (N, K/16), FP32 tensor scale s_g).
// Requirements: K % 32 == 0 (each lane loads 16 code bytes of a row), K <= W4A16F_MAX_K (x is
// staged in static shared memory), KS in {1, 2, 4, 8, 16}; x 16-byte aligned. Any N >= 1.
// x is staged once per CTA (~4 instructions per value of x), so T tiles amortize it.
//
// Entries (T 16-row tiles per CTA, KS warps per tile splitting K, no dynamic smem, T*KS <= 16):
//   w4a16_mma<K, KS, T, PF>(codes, scales, s_g, x, y, N)     grid = w4a16f_ctas(N, T), block = 32*KS*T
//   w4a16_mma_seg_list<K, KS, T, NSEG, PF>(segs, x)           grid = sum_s w4a16f_ctas(n_s, T)
//       PF (default 0): the first PF bytes of each code row (a multiple of 128, <= K/2) and PF/8 of
//       each scale row are prefetched into L2 before pdl_wait(), while the kernel before it runs
//       (H200, 128-expert seed shrink, in the replayed step: the KDA output projection after the
//       recurrence and gated norm ends ~3 us sooner, the six-segment input projection ~1 us; the
//       same prefetch in the FP8 DSA projections delayed the latency-bound quantizer before them
//       by ~6 us, so wxay does not prefetch into L2: it loads its first batch of weights into
//       registers before the wait instead, wxay.cuh). Measured again in the twenty-fourth
//       session's step, the whole step ran 0.5-0.8% faster without it, so sm_90 builds use PF 0
//       (kbpc/targets: l2_prefetch_bytes); the form stays for targets with a budget.
//       several projections of one input (W4A16SegList<NSEG> by value, as w4a16_gemv_seg_list).
//   w4a16_mma_f32_input<K, KS, T>(codes, scales, s_g, x, y, N) as w4a16_mma on an FP32 row x
//       (16-byte aligned), scaled the same way and staged in two FP16 parts, hi = f16(x 2^e) and
//       lo = f16(x 2^e - hi), each code word's A meeting both (16 MMAs a chunk): a staged value
//       errs by up to 2^-22 |x_k| + 2^-25 2^-e (gemv_bounds.w4a16_mma_act_bound, split). FP16
//       alone (11 of FP32's 24 bits) put the fast shared pair outside the fast-mode criterion.
//       K <= W4A16F_SPLIT_MAX_K.
//   w4a16_mma_shared_pair<K, I, KS0, T0, KS1, T1>(phase, gu codes/scales/s_g, x, dn codes/scales/s_g,
//       L, y, N): a shared expert (w4a16_shared_pair's parameters and launch order: phase 0 then
//       phase 1 on one stream; launches sharing a TU must not overlap), with the SwiGLU row act
//       (I FP32) in a device array private to the instantiating TU.
//       phase 0: grid = ceil(I / (8 T0)), block = 32 KS0 T0; tile tau holds gate rows 8 tau.. as
//         MMA rows 0-7 and up rows I + 8 tau.. as rows 8-15 of the [gate | up] weight (2I rows),
//         so a thread finishes g_i and u_i: each rn_bf16 as above, then glm_swiglu_clamp's exact
//         FP32 expression act_i = silu(fminf(g, L)) * fminf(fmaxf(u, -L), L) (the reference's
//         clamp_gate_up and silu input on the BF16 g, u), stored once.
//       phase 1: grid = ceil(N / (16 T1)), block = 32 KS1 T1: w4a16_mma_f32_input<I, KS1, T1> of act.
//       Requirements: K, I % 32 == 0, K <= W4A16F_MAX_K, I <= W4A16F_SPLIT_MAX_K. Bound:
//       kbpc.reference.gemv_bounds.shared_pair_fast_bound (phase 0's error through the SwiGLU,
//       plus act's split FP16 staging).
// Math (fast: a different accumulation order and precision point than the reference):
//   w_nk = q_nk s_nj is exact in FP16 (<= 6 significant bits, |w| in [2^-10, 2688]); the kernel
//   forms A = w * 2^-7 (exact, subnormals included) from the E2M1 bits placed as FP16 (q * 2^-14)
//   times the scale s * 2^7 (exact); the activation row is scaled by a power of two 2^e chosen per
//   CTA so that max|x| 2^e lies in [2^14, 2^15), then rounded to FP16 (exact unless |x| < max|x|
//   2^-31; error <= 2^-25 2^-e otherwise). Warp w of KS takes the 128-wide K chunks c = w (mod KS);
//   each chunk is 8 MMAs into two FP32 accumulators, each code word's first MMA into one and its
//   second into the other (the MMA's internal order is unspecified), added once at the end: two
//   dependency chains of half the length (H200, 128-expert seed shrink, 1k, against one chain:
//   KDA sublayer -0.2 us in replay timelines, `kbpc bench` -0.6% at 1k and -0.3% at 16k over two
//   calls, the MMA kernels' own end times within 0.2 us; bench/NOTES.md, twenty-eighth session);
//   the KS warp partials are added in warp order and y = rn_bf16(f32(P 2^(7-e)) s_g).
//   Bound (kbpc.reference.gemv_bounds.w4a16_mma_bound): |y - y_ref| <= c eps sum_k |w_nk x_k| + the
//   BF16 roundings, c derived there from the chain lengths.
// Layout: lane (g = lane/4, t = lane%4) loads 16 code bytes of rows g and g+8 per chunk (32 codes
//   each: groups 2t, 2t+1). The k order inside an MMA is permuted identically for A and B: each
//   code word (8 codes) becomes four FP16 pairs (n3,n7) (n1,n5) (n2,n6) (n0,n4), and the staged x
//   holds the same pairs, so one 16-byte shared load gives B for two MMAs. Every lane holds the same
//   B for its t, so all 8 D columns are equal and lane (g, 0) reads rows g and g+8 from d[0], d[2].
// PDL: the first batch of code and scale loads is issued before pdl_wait(); x after it. The
//   segment-list kernel releases its dependents as each CTA starts (a fan-out projection: its
//   same-stream successor, e.g. the KDA conv, is then resident and has its own loads in flight when
//   the projection completes; H200, 128-expert seed shrink, replay timelines: the KDA recurrence
//   9.2 -> 8.5 us, the gated norm ends 1.7 us after it instead of 2.3, step span 5576 us against
//   5590-5604 in builds without it). The other forms (one projection, FP32 input, shared pair)
//   release them right after their wait in w4a16f_mac (it was after the MMAs), as the FP8 and
//   routed slot GEMVs do: with all four, kbpc bench 4.90 -> 4.81 ms a step at 1k (H200, 128-expert
//   seed shrink; the replay timelines show the gain in the MoE sublayers only, bench/NOTES.md,
//   twenty-fifth session).
// Entry points: the __global__ template, or its body <name>_dev<...> for a TU's own wrapper.
// Phase stamps (kbp_stamps.cuh, all four kernels, in w4a16f_mac): 3 activation staged, 4 MMAs done.
#pragma once

#include "kbp_common.cuh"
#include "w4a16_gemv.cuh"

namespace kbp {

constexpr int W4A16F_MAX_K = 20480;  // x as FP16 pairs: 2.25 K bytes of static shared memory
constexpr int W4A16F_SPLIT_MAX_K = 10240;  // an FP32 row staged as hi and lo FP16 pairs: twice that
constexpr int W4A16F_BATCH = 4;      // chunks per warp whose code loads are in flight together
// CTAs per SM the register allocation must allow: 16 warps per SM (<= 128 registers per thread),
// enough loads in flight (two batches of 4 KB per warp) to cover the DRAM latency.
#define W4A16F_MIN_CTAS(warps) ((warps) >= 16 ? 1 : 16 / (warps))
// The segment-list form (a fan-out projection, several waves of CTAs) asks for 24 warps per SM
// (<= 85 registers; the KDA six-segment instance needs 80, no spills): H200, 128-expert seed shrink,
// 1k, replay timeline: it ends 21.0 us after the hc boundary instead of 23.3 at 16 warps per SM, the
// KDA sublayer 43.2 us instead of 45.3 (step span 5167 against 5213 us). At 32 warps (64 registers,
// 16 bytes of spills) it ends sooner still (19.7 us), but the boundary after the layer ends later.
#define W4A16F_SEG_MIN_CTAS(warps) ((warps) >= 16 ? 1 : 24 / (warps))

// Shared-memory slot (uint4 units) of 8-value block b: one pad slot every 8 blocks, so the four
// lanes t = 0..3 of a quad (64 bytes apart) hit distinct banks.
__host__ __device__ constexpr int w4a16f_slot(int b) { return b + (b >> 3); }

__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// Two E4M3 scale bytes (low byte -> low half) as FP16 pairs, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t s) {
    uint32_t d;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(s));
    return d;
}

__device__ __forceinline__ uint32_t f32x2_to_f16x2(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                 uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// FP16 pairs of 8 scaled values into slot b: the pairs of e2m1x8_f16, (x3,x7) (x1,x5) (x2,x6) (x0,x4).
// With xs_lo (the split staging of an FP32 row), each value h also leaves its remainder h - f16(h)
// (exact in FP32) rounded to FP16 in xs_lo: h = hi + lo within 2^-22 |h| + 2^-25.
__device__ __forceinline__ void w4a16f_store8(uint4* xs, uint4* xs_lo, int b, const float (&v)[8], float f) {
    constexpr int PAIR[4][2] = {{3, 7}, {1, 5}, {2, 6}, {0, 4}};   // e2m1x8_f16's order
    float h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) h[j] = __fmul_rn(v[j], f);
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) hi[i] = f32x2_to_f16x2(h[PAIR[i][0]], h[PAIR[i][1]]);
    xs[w4a16f_slot(b)] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    if (xs_lo != nullptr) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 r = __half22float2(*reinterpret_cast<const __half2*>(&hi[i]));
            lo[i] = f32x2_to_f16x2(__fsub_rn(h[PAIR[i][0]], r.x), __fsub_rn(h[PAIR[i][1]], r.y));
        }
        xs_lo[w4a16f_slot(b)] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
}

// The CTA's max over its threads' m (one barrier); `red` holds NT/32 floats. Returns 2^e for
// max|x| in [2^E, 2^(E+1)): e = 14 - E (a zero or subnormal max takes the largest e, 126).
template <int NT>
__device__ __forceinline__ int w4a16f_scale_exp(float m, float* red) {
    m = warp_max_xor(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) m = fmaxf(m, red[w]);
    const int be = (int)((__float_as_uint(m) >> 23) & 0xffu);
    return max(-126, min(126, 14 - (be - 127)));
}

// Stage an activation row of K values as FP16 pairs times 2^e into xs, zero-padding to whole
// chunks; returns 2^-e. load8(b, h) reads values 8b..8b+7 as FP32 into h. All NT threads of the CTA
// call it (two barriers). HOLD: where each thread has at most HOLD 8-value blocks, they are loaded
// once and kept in registers; otherwise pass 2 loads them again (cache hits).
template <int K, int NT, int HOLD, class Load8>
__device__ __forceinline__ float w4a16f_stage(Load8 load8, uint4* xs, uint4* xs_lo, float* red) {
    constexpr int NB = K / 8, NBP = (K + 127) / 128 * 16, PER = (NBP + NT - 1) / NT;
    float m = 0.0f;
    if constexpr (PER <= HOLD) {
        float v[PER][8];
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int b = threadIdx.x + p * NT;
#pragma unroll
            for (int j = 0; j < 8; ++j) v[p][j] = 0.0f;
            if (b < NB) load8(b, v[p]);
#pragma unroll
            for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[p][j]));
        }
        const int e = w4a16f_scale_exp<NT>(m, red);
        const float f = __uint_as_float((uint32_t)(e + 127) << 23);
#pragma unroll
        for (int p = 0; p < PER; ++p)
            if (threadIdx.x + p * NT < NBP) w4a16f_store8(xs, xs_lo, threadIdx.x + p * NT, v[p], f);
        __syncthreads();
        return __uint_as_float((uint32_t)(127 - e) << 23);
    } else {
#pragma unroll 4
        for (int b = threadIdx.x; b < NB; b += NT) {  // pass 1: max |x|
            float h[8];
            load8(b, h);
#pragma unroll
            for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(h[j]));
        }
        const int e = w4a16f_scale_exp<NT>(m, red);
        const float f = __uint_as_float((uint32_t)(e + 127) << 23);
#pragma unroll 4
        for (int b = threadIdx.x; b < NBP; b += NT) {  // pass 2 (cache hits): scale, round, pair, store
            float h[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (b < NB) load8(b, h);
            w4a16f_store8(xs, xs_lo, b, h, f);
        }
        __syncthreads();
        return __uint_as_float((uint32_t)(127 - e) << 23);
    }
}

// x as K BF16 values (widened exactly).
template <int K, int NT>
__device__ __forceinline__ float w4a16f_stage_x(const __nv_bfloat16* x, uint4* xs, float* red) {
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    return w4a16f_stage<K, NT, 0>([x4](int b, float (&h)[8]) {
        const uint4 r = ld_step(x4 + b);
        const uint32_t v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            h[2 * j] = __uint_as_float(v[j] << 16);
            h[2 * j + 1] = __uint_as_float(v[j] & 0xffff0000u);
        }
    }, xs, nullptr, red);
}

// x as K FP32 values (16-byte aligned; the shared pair's SwiGLU row, written by the previous launch:
// read through L2, and held in registers where a thread has at most two 8-value blocks), split
// into FP16 hi (xs) and lo (xs_lo) parts: FP16 alone keeps 11 of FP32's 24 bits, and that staging
// error set the pair's whole error (tiny example, fast mode: logits relative L2 0.040 against the
// criterion's 1e-2 on an H200, twenty-sixth session); the split keeps ~22.
template <int K, int NT>
__device__ __forceinline__ float w4a16f_stage_f32(const float* x, uint4* xs, uint4* xs_lo, float* red) {
    static_assert(K <= W4A16F_SPLIT_MAX_K, "the split FP32 row must fit static shared memory");
    const float4* x4 = reinterpret_cast<const float4*>(x);
    return w4a16f_stage<K, NT, 2>([x4](int b, float (&h)[8]) {
        const float4 a = __ldcg(x4 + 2 * b), c = __ldcg(x4 + 2 * b + 1);
        h[0] = a.x; h[1] = a.y; h[2] = a.z; h[3] = a.w; h[4] = c.x; h[5] = c.y; h[6] = c.z; h[7] = c.w;
    }, xs, xs_lo, red);
}

// One warp's code and scale registers for W4A16F_BATCH chunks (rows g and g+8).
struct W4A16FBatch {
    uint4 c[W4A16F_BATCH][2];
    uint16_t s[W4A16F_BATCH][2];
};

// Load chunks w + KS*(b0 + i): 16 code bytes and 2 scale bytes per row; zeros past K.
template <int K, int KS>
__device__ __forceinline__ void w4a16f_load(W4A16FBatch& r, const uint8_t* cg, const uint8_t* c8,
                                            const uint8_t* sg, const uint8_t* s8,
                                            int warp, int t, int b0) {
    constexpr int NCH = (K + 127) / 128;
#pragma unroll
    for (int i = 0; i < W4A16F_BATCH; ++i) {
        const int c = warp + KS * (b0 + i);
        const bool ok = c < NCH && 128 * c + 32 * t < K;
        const int off = 64 * c + 16 * t, soff = 8 * c + 2 * t;
        r.c[i][0] = ok ? ld_weight(reinterpret_cast<const uint4*>(cg + off)) : make_uint4(0u, 0u, 0u, 0u);
        r.c[i][1] = ok ? ld_weight(reinterpret_cast<const uint4*>(c8 + off)) : make_uint4(0u, 0u, 0u, 0u);
        r.s[i][0] = ok ? ld_weight(reinterpret_cast<const unsigned short*>(sg + soff)) : (uint16_t)0;
        r.s[i][1] = ok ? ld_weight(reinterpret_cast<const unsigned short*>(s8 + soff)) : (uint16_t)0;
    }
}

// The 8 MMAs of one chunk: code word i of rows g / g+8 (group i/2) against x blocks 16c + 4t + i,
// its first MMA into d and its second into e; with xs_lo (LO: a split FP32 row) the same A against
// the lo blocks too, into the same accumulators (16 MMAs).
template <bool LO>
__device__ __forceinline__ void w4a16f_chunk(const uint4 (&cw)[2], const uint16_t (&sc)[2], const uint4* xs,
                                             const uint4* xs_lo, int c, int t, float (&d)[4], float (&e)[4]) {
    constexpr uint32_t S128 = 0x58005800u;  // FP16 pair (128, 128)
    const uint32_t sg2 = hmul2_u32(e4m3x2_to_f16x2(sc[0]), S128), s82 = hmul2_u32(e4m3x2_to_f16x2(sc[1]), S128);
    const uint32_t wg[4] = {cw[0].x, cw[0].y, cw[0].z, cw[0].w};
    const uint32_t w8[4] = {cw[1].x, cw[1].y, cw[1].z, cw[1].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t selg = __byte_perm(sg2, 0u, i < 2 ? 0x1010 : 0x3232);  // (s, s) of group i/2
        const uint32_t sel8 = __byte_perm(s82, 0u, i < 2 ? 0x1010 : 0x3232);
        uint32_t pg[4], p8[4];
        e2m1x8_f16(wg[i], pg);
        e2m1x8_f16(w8[i], p8);
        const uint4 xb = xs[w4a16f_slot(16 * c + 4 * t + i)];
        const uint32_t a[8] = {hmul2_u32(pg[0], selg), hmul2_u32(p8[0], sel8), hmul2_u32(pg[1], selg),
                               hmul2_u32(p8[1], sel8), hmul2_u32(pg[2], selg), hmul2_u32(p8[2], sel8),
                               hmul2_u32(pg[3], selg), hmul2_u32(p8[3], sel8)};
        mma_f16_m16n8k16(d, a[0], a[1], a[2], a[3], xb.x, xb.y);
        mma_f16_m16n8k16(e, a[4], a[5], a[6], a[7], xb.z, xb.w);
        if constexpr (LO) {
            const uint4 xl = xs_lo[w4a16f_slot(16 * c + 4 * t + i)];
            mma_f16_m16n8k16(d, a[0], a[1], a[2], a[3], xl.x, xl.y);
            mma_f16_m16n8k16(e, a[4], a[5], a[6], a[7], xl.z, xl.w);
        }
    }
}

// The MMA loop of one CTA (NT = 32 * warps threads): warp w takes the K chunks c = w % KS (mod KS)
// of its tile, whose lane rows g / g+8 are rows min(bg + g, lg) / min(b8 + g, l8) of the weight
// (clamped rows are read, never stored). The first batch of weight loads is issued before
// pdl_wait(), then stage() stages the activation into xs and returns its 2^-e. Leaves each warp's
// 16 row partials in part[warp] (after a barrier) and returns 2^-e.
template <int K, int KS, int NT, int PF, bool LO, class Stage>
__device__ __forceinline__ float w4a16f_mac(const uint8_t* codes, const uint8_t* scales,
                                            int bg, int lg, int b8, int l8, Stage stage, const uint4* xs,
                                            const uint4* xs_lo, float (*part)[16]) {
    static_assert(K % 32 == 0 && K <= W4A16F_MAX_K, "w4a16_mma: K % 32 == 0 and K <= W4A16F_MAX_K");
    static_assert(KS == 1 || KS == 2 || KS == 4 || KS == 8 || KS == 16, "w4a16_mma: KS warps per tile");
    static_assert(NT % (32 * KS) == 0 && NT <= 512, "w4a16_mma: at most 16 warps per CTA");
    constexpr int NCH = (K + 127) / 128, PER = (NCH + KS - 1) / KS;
    constexpr int NBATCH = (PER + W4A16F_BATCH - 1) / W4A16F_BATCH;
    const int warp = threadIdx.x >> 5, ks = warp % KS, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const size_t rg = (size_t)min(bg + g, lg), r8 = (size_t)min(b8 + g, l8);
    const uint8_t *cg = codes + rg * (K / 2), *c8 = codes + r8 * (K / 2);
    const uint8_t *sg = scales + rg * (K / 16), *s8 = scales + r8 * (K / 16);
    if constexpr (PF > 0) {  // the first PF code bytes (and PF / 8 scale bytes) of the tile's 16 rows
        static_assert(PF % 128 == 0 && PF <= K / 2, "w4a16_mma: PF is whole lines of a code row");
        prefetch_l2(cg, PF, t + 4 * ks, 4 * KS);   // the lines split over the tile's 4 * KS lanes t
        prefetch_l2(c8, PF, t + 4 * ks, 4 * KS);
        prefetch_l2(sg, PF / 8, t + 4 * ks, 4 * KS);
        prefetch_l2(s8, PF / 8, t + 4 * ks, 4 * KS);
    }
    W4A16FBatch cur;
    w4a16f_load<K, KS>(cur, cg, c8, sg, s8, ks, t, 0);
    KBP_STAMP(kStampWaitIn);
    pdl_wait();
    KBP_STAMP(kStampWaitOut);
    pdl_launch_dependents();   // see the header
    const float unscale = stage();
    KBP_STAMP(3);   // the activation staged (its 2^e known)
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e[4] = {0.0f, 0.0f, 0.0f, 0.0f};   // the two MMA chains
#pragma unroll
    for (int b = 0; b < NBATCH; ++b) {
        W4A16FBatch nxt;
        if (b + 1 < NBATCH) w4a16f_load<K, KS>(nxt, cg, c8, sg, s8, ks, t, (b + 1) * W4A16F_BATCH);
#pragma unroll
        for (int i = 0; i < W4A16F_BATCH; ++i) {
            const int c = ks + KS * (b * W4A16F_BATCH + i);
            if (b * W4A16F_BATCH + i < PER && c < NCH) w4a16f_chunk<LO>(cur.c[i], cur.s[i], xs, xs_lo, c, t, d, e);  // warp-uniform
        }
        if (b + 1 < NBATCH) cur = nxt;
    }
    if (t == 0) { part[warp][g] = d[0] + e[0]; part[warp][g + 8] = d[2] + e[2]; }
    __syncthreads();
    KBP_STAMP(4);   // the CTA's last MMA done, every warp's row partials in shared memory
    return unscale;
}

// Shared-memory slots (uint4) of a staged K-wide row.
__host__ __device__ constexpr int w4a16f_xs_slots(int k) { return w4a16f_slot((k + 127) / 128 * 16); }

// One CTA's T 16-row tiles starting at row n0 of an N-row projection: warp w takes tile w / KS;
// the activation is staged once for all of them by stage(); y = rn_bf16(P 2^(7-e) s_g).
template <int K, int KS, int T, int PF, bool LO, class Stage>
__device__ __forceinline__ void w4a16f_tiles_in(const uint8_t* codes, const uint8_t* scales,
                                                float gscale, __nv_bfloat16* y, int N, int n0, Stage stage,
                                                const uint4* xs, const uint4* xs_lo, float (*part)[16]) {
    static_assert(T >= 1 && T * KS <= 16, "w4a16_mma: at most 16 warps per CTA");
    const int r0 = n0 + 16 * ((threadIdx.x >> 5) / KS);
    const float unscale = w4a16f_mac<K, KS, 32 * KS * T, PF, LO>(codes, scales, r0, N - 1, r0 + 8, N - 1, stage, xs,
                                                                  xs_lo, part);
    const int tile = threadIdx.x >> 4, row = threadIdx.x & 15, n = n0 + 16 * tile + row;
    if (tile < T && n < N) {
        float p = part[tile * KS][row];
#pragma unroll
        for (int w = 1; w < KS; ++w) p = __fadd_rn(p, part[tile * KS + w][row]);
        y[n] = f32_to_bf16(__fmul_rn(__fmul_rn(p, __fmul_rn(unscale, 128.0f)), gscale));
    }
}

// The BF16-activation form; PF: code bytes of each row prefetched into L2 before pdl_wait().
template <int K, int KS, int T, int PF>
__device__ __forceinline__ void w4a16f_tiles(const uint8_t* codes, const uint8_t* scales,
                                             float gscale, __nv_bfloat16* y, int N, int n0,
                                             const __nv_bfloat16* x) {
    __shared__ uint4 xs[w4a16f_xs_slots(K)];
    __shared__ float red[T * KS], part[T * KS][16];
    w4a16f_tiles_in<K, KS, T, PF, false>(codes, scales, gscale, y, N, n0,
                                         [&]() { return w4a16f_stage_x<K, 32 * T * KS>(x, xs, red); }, xs, nullptr, part);
}

template <int K, int KS, int T, int PF = 0>
__device__ __forceinline__ void w4a16_mma_dev(const uint8_t* codes, const uint8_t* scales,
                                              float gscale, const __nv_bfloat16* x,
                                              __nv_bfloat16* y, int N) {
    w4a16f_tiles<K, KS, T, PF>(codes, scales, gscale, y, N, blockIdx.x * 16 * T, x);
}

template <int K, int KS, int T, int PF = 0>
__global__ void __launch_bounds__(32 * KS * T, W4A16F_MIN_CTAS(KS * T)) w4a16_mma(const uint8_t* codes,
                                                         const uint8_t* scales, float gscale,
                                                         const __nv_bfloat16* x,
                                                         __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    w4a16_mma_dev<K, KS, T, PF>(codes, scales, gscale, x, y, N);
    KBP_STAMP_END();
}

__host__ __device__ constexpr int w4a16f_ctas(int n, int t) { return (n + 16 * t - 1) / (16 * t); }

template <int K, int KS, int T, int PF = 0>
__device__ __forceinline__ void w4a16_mma_seg_dev(const W4A16Seg* table, int nseg,
                                                  const __nv_bfloat16* x) {
    int b = blockIdx.x, s = 0;  // CTAs are handed out segment by segment, w4a16f_ctas(n, T) each
    while (s < nseg - 1 && b >= w4a16f_ctas(table[s].n, T)) { b -= w4a16f_ctas(table[s].n, T); ++s; }
    const W4A16Seg seg = table[s];
    w4a16f_tiles<K, KS, T, PF>(seg.codes, seg.scales, seg.gscale, seg.y, seg.n, b * 16 * T, x);
}

template <int K, int KS, int T, int NSEG, int PF = 0>
__global__ void __launch_bounds__(32 * KS * T, W4A16F_SEG_MIN_CTAS(KS * T)) w4a16_mma_seg_list(const __grid_constant__ W4A16SegList<NSEG> segs,
                                                                  const __nv_bfloat16* x) {
    static_assert(NSEG >= 1 && NSEG <= W4A16_MAX_SEGS, "segments per launch");
    KBP_STAMP_BEGIN();
    pdl_launch_dependents();  // at CTA start (see the header); w4a16f_mac's trigger is then a no-op
    w4a16_mma_seg_dev<K, KS, T, PF>(segs.seg, NSEG, x);
    KBP_STAMP_END();
}


// ------------------------------------------------------------------ FP32 input, shared expert pair

template <int K, int KS, int T>
__device__ __forceinline__ void w4a16_mma_f32_input_dev(const uint8_t* codes,
                                                        const uint8_t* scales, float gscale,
                                                        const float* x, __nv_bfloat16* y,
                                                        int N) {
    __shared__ uint4 xs[2 * w4a16f_xs_slots(K)];   // hi, then lo
    __shared__ float red[T * KS], part[T * KS][16];
    uint4* xs_lo = xs + w4a16f_xs_slots(K);
    w4a16f_tiles_in<K, KS, T, 0, true>(codes, scales, gscale, y, N, blockIdx.x * 16 * T,
                                       [&]() { return w4a16f_stage_f32<K, 32 * T * KS>(x, xs, xs_lo, red); }, xs, xs_lo,
                                       part);
}

template <int K, int KS, int T>
__global__ void __launch_bounds__(32 * KS * T, W4A16F_MIN_CTAS(KS * T))
    w4a16_mma_f32_input(const uint8_t* codes, const uint8_t* scales, float gscale,
                        const float* x, __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    w4a16_mma_f32_input_dev<K, KS, T>(codes, scales, gscale, x, y, N);
    KBP_STAMP_END();
}

namespace {  // internal linkage: each TU (kernel instance) owns its SwiGLU row
template <int I>
__device__ __align__(16) float w4a16f_pair_row[I];
}  // namespace

// Phase 0 of the pair: T tiles per CTA, tile tau = the 8 gate rows 8 tau.. (MMA rows 0-7) and the
// 8 up rows I + 8 tau.. (MMA rows 8-15), so one thread finishes g_i and u_i together:
// g, u = rn_bf16(P 2^(7-e) s_g) as the one-linear form, then the exact element expression of
// glm_swiglu_clamp in FP32: act_i = f32(silu(fminf(g, L)) * fminf(fmaxf(u, -L), L)), stored in FP32.
template <int K, int I, int KS, int T>
__device__ __forceinline__ void w4a16f_pair_gate_up(const uint8_t* codes,
                                                    const uint8_t* scales, float gscale,
                                                    const __nv_bfloat16* x, float limit, float* act,
                                                    uint4* xs, float* red, float (*part)[16]) {
    static_assert(I % 8 == 0, "w4a16_mma_shared_pair: 8 gate and 8 up rows per tile");
    const int tau = blockIdx.x * T + (threadIdx.x >> 5) / KS;
    const float unscale = w4a16f_mac<K, KS, 32 * KS * T, 0, false>(
        codes, scales, 8 * tau, I - 1, I + 8 * tau, 2 * I - 1,
        [&]() { return w4a16f_stage_x<K, 32 * KS * T>(x, xs, red); }, xs, nullptr, part);
    const int tile = threadIdx.x >> 3, row = threadIdx.x & 7, i = 8 * (blockIdx.x * T + tile) + row;
    if (tile < T && i < I) {
        float pg = part[tile * KS][row], pu = part[tile * KS][row + 8];
#pragma unroll
        for (int w = 1; w < KS; ++w) {
            pg = __fadd_rn(pg, part[tile * KS + w][row]);
            pu = __fadd_rn(pu, part[tile * KS + w][row + 8]);
        }
        const float s = __fmul_rn(unscale, 128.0f);
        const float g = fminf(__bfloat162float(f32_to_bf16(__fmul_rn(__fmul_rn(pg, s), gscale))), limit);
        const float u = __bfloat162float(f32_to_bf16(__fmul_rn(__fmul_rn(pu, s), gscale)));
        act[i] = __fmul_rn(silu_f32(g), fminf(fmaxf(u, -limit), limit));
    }
}

#define W4A16F_PAIR_WARPS (KS0 * T0 > KS1 * T1 ? KS0 * T0 : KS1 * T1)

template <int K, int I, int KS0, int T0, int KS1, int T1>
__device__ __forceinline__ void w4a16_mma_shared_pair_dev(int phase, const uint8_t* gu_codes,
                                                          const uint8_t* gu_scales, float gu_gscale,
                                                          const __nv_bfloat16* x,
                                                          const uint8_t* dn_codes,
                                                          const uint8_t* dn_scales, float dn_gscale,
                                                          float limit, __nv_bfloat16* y, int N) {
    static_assert(KS0 * T0 <= 16 && KS1 * T1 <= 16, "w4a16_mma_shared_pair: at most 16 warps per CTA");
    // One staging buffer for both phases: x, or the act row's hi then lo parts.
    constexpr int SLOTS = w4a16f_xs_slots(K) > 2 * w4a16f_xs_slots(I) ? w4a16f_xs_slots(K) : 2 * w4a16f_xs_slots(I);
    __shared__ uint4 xs[SLOTS];
    uint4* xs_lo = xs + w4a16f_xs_slots(I);
    __shared__ float red[16], part[16][16];
    float* act = w4a16f_pair_row<I>;
    if (phase == 0)  // uniform per launch
        w4a16f_pair_gate_up<K, I, KS0, T0>(gu_codes, gu_scales, gu_gscale, x, limit, act, xs, red, part);
    else
        w4a16f_tiles_in<I, KS1, T1, 0, true>(dn_codes, dn_scales, dn_gscale, y, N, blockIdx.x * 16 * T1,
                                          [&]() { return w4a16f_stage_f32<I, 32 * KS1 * T1>(act, xs, xs_lo, red); },
                                          xs, xs_lo, part);
}

template <int K, int I, int KS0, int T0, int KS1, int T1>
__global__ void __launch_bounds__(32 * W4A16F_PAIR_WARPS, W4A16F_MIN_CTAS(W4A16F_PAIR_WARPS))
    w4a16_mma_shared_pair(int phase, const uint8_t* gu_codes, const uint8_t* gu_scales,
                          float gu_gscale, const __nv_bfloat16* x, const uint8_t* dn_codes,
                          const uint8_t* dn_scales, float dn_gscale, float limit,
                          __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    w4a16_mma_shared_pair_dev<K, I, KS0, T0, KS1, T1>(phase, gu_codes, gu_scales, gu_gscale, x, dn_codes, dn_scales,
                                                      dn_gscale, limit, y, N);
    KBP_STAMP_END();
}

#undef W4A16F_PAIR_WARPS

}  // namespace kbp
