// w4a16_gemv.cuh: NVFP4-weight x BF16-activation one-row GEMV on CUDA cores (family w4a16_gemv).
//
// Weight format (nvfp4/g16, plain layout): codes (N, K/2) uint8, two E2M1 codes per byte, the even
// element in the low nibble; scales (N, K/16) E4M3 bytes; one FP32 tensor scale s_g.
// Requirements: K % 16 == 0 (template), codes rows 8-byte aligned (K/2 % 8 == 0 holds), x 16-byte
// aligned. Outputs BF16, rounded once (RNE).
//
// Entries (256-thread CTAs, 64 threads per output, 16 outputs per CTA: each 64-thread group plays
// "thread l" for W4A16_ROWS = 4 rows, so x is loaded once per 4 rows; no dynamic smem):
//   w4a16_gemv<K>(codes, scales, s_g, x, y, N)              grid = w4a16_ctas(N) = ceil(N/16)
//   w4a16_gemv_seg<K>(table, nseg, x)                        grid = sum_s w4a16_ctas(n_s)
//       up to W4A16_MAX_SEGS projections sharing x in one launch (w4a16_gemv_pipe_m1's groups,
//       e.g. a KDA layer's q,k,v,f_a,b,g_a); `table` is a device array of W4A16Seg (see below,
//       host side: kbp test/bench code packs it with numpy). Each output has w4a16_gemv's bytes.
//   w4a16_gemv_silu_input<K>(codes, scales, s_g, g, u, y, N) grid = w4a16_ctas(N); K <= 10240
//       (x is computed once per CTA into 4K bytes of static shared memory)
//       the input is x_k = silu(g_k) * u_k in FP32 (g/(1+expf(-g)) then * u), never rounded,
//       with the 8-value walk (see w4a16_silu_partial). expf is CUDA's (<= 2 ulp), so this entry
//       matches the reference within the GPU test's tolerance; the others are bit-exact.
//   w4a16_gemv_seg_list<K, NSEG>(segs, x)                    grid = sum_s w4a16_ctas(n_s)
//       w4a16_gemv_seg with the table passed by value (a __grid_constant__ W4A16SegList<NSEG>):
//       it lives in the launch's parameter space (device constant memory, captured into a CUDA
//       graph node with the launch), so generated code needs no host packing or table buffer.
//   w4a16_gemv_silu_clamp_input<K>(codes, scales, s_g, g, u, L, y, N)  as w4a16_gemv_silu_input
//       on the clamped inputs g^ = fminf(g, L), u^ = fminf(fmaxf(u, -L), L) (glm_swiglu_clamp's
//       exact clamps, kept in FP32): x_k = silu(g^_k) * u^_k.
//   w4a16_shared_pair<K, I>(phase, gu codes/scales/s_g, x, dn codes/scales/s_g, L, y, N)
//       a shared expert's two GEMVs with the [g | u] row (2I BF16) in a device scratch private to
//       the TU that instantiates it: phase 0 (grid = w4a16_ctas(2I)) is w4a16_gemv<K> of x into
//       the scratch; phase 1 (grid = w4a16_ctas(N)) is w4a16_gemv_silu_clamp_input<I> of it into
//       y. Launch phase 0 then phase 1 on one stream; launches sharing a TU must not overlap.
// Math (16-value chunk walk; explain.families.w4a16_gemv): thread l of an output's 64 takes the
//   16-value chunks j = l, l+64, ... in increasing order; per chunk p = +0 then
//   p = fma(q_i, x_i, p) for i = 0..15, and acc = fma(p, f32(s_g * s_nj), acc); each warp reduces
//   with the shuffle tree (offsets 16..1) and y = rn_bf16(P0 + P1).
// Speed: each thread issues its 8-byte code and scale loads (W4A16_BATCH chunks x 4 rows) before the
//   arithmetic. E2M1 codes become FP16 pairs of q * 2^-14 (e2m1x8_f16: 11 integer instructions per
//   8 values), widened to FP32 (one HADD2.F32 each) and chained with x * 2^14 (exact for |x| <
//   2^113; fma(q 2^-14, x 2^14, p) == fma(q, x, p) bit for bit): ~3.5-4 instructions per value,
//   against ~9 for the earlier decode (kept for CTAs whose x has an element >= 2^113). The
//   numerics-fast form on tensor cores is kernels/w4a16_mma.cuh.
// PDL: every entry issues its first batch of weight loads (W4A16_BATCH chunks a row: the whole
//   slice of a thread when K <= 4096) before pdl_wait(), reads x (or g, u) after it, and releases
//   its dependents right after the wait, as the fast forms do. Before, these kernels waited first
//   and never triggered: the exact build (numerics `exact`) ran 6.04-6.05 ms a step at 1k, with
//   this 5.84-5.87 (H200, 128-expert seed shrink, interleaved, logits bit-equal; at 16k 6.19 ->
//   6.01 with the pair's trigger on; bench/NOTES.md, twenty-sixth session). The shared expert pair
//   (used in both modes) loads early but does not trigger (kW4A16PairTrigger).
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
// Phase stamps (kbp_stamps.cuh, every kernel here): the wait, and 3 when the thread's walk is done.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

constexpr int W4A16_MAX_SEGS = 6;
constexpr int W4A16_BATCH = 4;  // chunks per row a thread keeps in flight
constexpr int W4A16_ROWS = 4;   // output rows per 64-thread group (16 per CTA)
__host__ __device__ constexpr int w4a16_ctas(int n) { return (n + 4 * W4A16_ROWS - 1) / (4 * W4A16_ROWS); }

// One projection of a segmented launch, as laid out in device memory (32 bytes, numpy-packable:
// three uint64 pointers, float32 s_g, int32 n).
struct W4A16Seg {
    const uint8_t* codes;
    const uint8_t* scales;
    __nv_bfloat16* y;
    float gscale;
    int n;
};
static_assert(sizeof(W4A16Seg) == 32, "W4A16Seg is packed by the host as 32 bytes");

// E2M1 value of the nibble at bit `sh` of w, exactly: the 3 magnitude bits placed at FP32 bits
// 22..24 read as 2^-126 * q for every code (subnormals included), so one exact multiply by 2^126
// gives q; the sign bit goes to bit 31.
__device__ __forceinline__ float e2m1_at(uint32_t w, int sh) {
    uint32_t c = w >> sh;
    return __uint_as_float(((c & 7u) << 22) | ((c & 8u) << 28)) * 0x1p126f;
}

// The 8 E2M1 codes of w (nibble i = element i) as four FP16 pairs of q * 2^-14, exactly: an E2M1
// code s e1 e0 m placed at FP16 bits 15, 11, 10, 9 reads as q * 2^-14 (the subnormal 0.5 too).
// Bytes of v: (s << 7) | (mag << 1) of the high nibble of each byte of w, u the same for the low
// nibbles; the pairs are p[0] = (n3, n7), p[1] = (n1, n5), p[2] = (n2, n6), p[3] = (n0, n4)
// (element n_i in the low half). 11 integer instructions per 8 values.
__device__ __forceinline__ void e2m1x8_f16(uint32_t w, uint32_t (&p)[4]) {
    const uint32_t v = ((w >> 3) & 0x0E0E0E0Eu) | (w & 0x80808080u);
    const uint32_t u = ((w << 1) & 0x0E0E0E0Eu) | ((w << 4) & 0x80808080u);
    p[0] = v & 0xFF00FF00u;
    p[1] = __byte_perm(v, 0u, 0x2404);
    p[2] = u & 0xFF00FF00u;
    p[3] = __byte_perm(u, 0u, 0x2404);
}

// p = fma chain over the 16 (code, x) pairs of one chunk, starting from +0 (any x: the slow path,
// taken when some |x_k| >= 2^113, where x * 2^14 below would overflow).
struct X16 { uint4 a, b; };
__device__ __forceinline__ float w4a16_chunk16(uint2 codes, const X16& x) {
    const uint32_t xv[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        uint32_t w = i < 8 ? codes.x : codes.y;
        uint32_t xb = xv[i >> 1];
        float xi = __uint_as_float((i & 1) ? (xb & 0xffff0000u) : (xb << 16));
        p = __fmaf_rn(e2m1_at(w, 4 * (i & 7)), xi, p);
    }
    return p;
}

// The same chain from FP16-placed codes: fma(q 2^-14, x 2^14, p) == fma(q, x, p) bit for bit (the
// products are equal as real numbers and an FMA rounds once), at about 3.5 instead of 9
// instructions per value. xs = x_i * 2^14 (exact while |x_i| < 2^113).
__device__ __forceinline__ float w4a16_chunk16_f16(uint2 codes, const float (&xs)[16]) {
    uint32_t lo[4], hi[4];
    e2m1x8_f16(codes.x, lo);
    e2m1x8_f16(codes.y, hi);
    // element i of a word sits in pair (3,1,2,0)[i % 4], low half for i < 4
    const uint32_t pair[8] = {lo[3], lo[1], lo[2], lo[0], hi[3], hi[1], hi[2], hi[0]};
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const uint32_t h = pair[4 * (i >> 3) + (i & 3)];
        const float q = __half2float(__ushort_as_half((unsigned short)((i & 4) ? h >> 16 : h & 0xffffu)));
        p = __fmaf_rn(q, xs[i], p);
    }
    return p;
}

// Whether any |x_k| >= 2^113 (or is not finite): then x * 2^14 is not exact and the CTA takes the
// slow decode. Reads all of x once (the main loop then hits L1); uniform over the CTA.
template <int K>
__device__ __forceinline__ bool w4a16_x_big(const uint4* x) {
    bool big = false;
    for (int v = threadIdx.x; v < K / 8; v += blockDim.x) {
        const uint4 r = ld_step(x + v);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) big |= (w[j] & 0x7fffu) >= 0x7800u || ((w[j] >> 16) & 0x7fffu) >= 0x7800u;
    }
    return __syncthreads_or(big) != 0;
}

// Thread l's weights for its first W4A16_BATCH chunks (the 8-byte codes and the scale byte of each
// of the group's rows): what the walk loads first, loaded before the dependency wait by w4a16_cta.
struct W4A16Batch {
    uint2 c[W4A16_BATCH][W4A16_ROWS];
    uint8_t s[W4A16_BATCH][W4A16_ROWS];
};

// Thread l's loads of the chunks j = l + 64 (b0 + t), t < W4A16_BATCH, of the group's rows.
template <int K>
__device__ __forceinline__ void w4a16_load_batch(const uint8_t* codes, const uint8_t* scales, int l, int valid,
                                                 int b0, W4A16Batch& b) {
    constexpr int NC = K / 16, PER = (NC + 63) / 64, R = W4A16_ROWS;
#pragma unroll
    for (int t = 0; t < W4A16_BATCH; ++t) {
        const int j = l + 64 * (b0 + t);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (b0 + t < PER && j < NC && r < valid) {
                b.c[t][r] = ld_weight(reinterpret_cast<const uint2*>(codes + (size_t)r * (K / 2)) + j);
                b.s[t][r] = ld_weight(scales + (size_t)r * (K / 16) + j);
            }
    }
}

// Thread l's accumulators for W4A16_ROWS consecutive output rows (rows n0.. with `valid` of them
// real) over its chunks j = l, l+64, ...: each x chunk is loaded and widened once for all rows.
// PRELOADED: `first` holds the first batch (w4a16_load_batch at b0 = 0), already in flight.
template <int K, bool BIG, bool PRELOADED>
__device__ __forceinline__ void w4a16_rows_walk(const uint8_t* codes, const uint8_t* scales,
                                                float gscale, const uint4* x, int l, int valid,
                                                float (&acc)[W4A16_ROWS], const W4A16Batch& first) {
    constexpr int NC = K / 16, PER = (NC + 63) / 64, R = W4A16_ROWS;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int b0 = 0; b0 < PER; b0 += W4A16_BATCH) {
        W4A16Batch wb;
        if (PRELOADED && b0 == 0) wb = first;
        else w4a16_load_batch<K>(codes, scales, l, valid, b0, wb);
#pragma unroll
        for (int t = 0; t < W4A16_BATCH; ++t) {
            const int j = l + 64 * (b0 + t);
            if (b0 + t < PER && j < NC) {
                const X16 xv{ld_step(x + 2 * j), ld_step(x + 2 * j + 1)};
                float xs[16];
                if (!BIG) {
                    const uint32_t xw[8] = {xv.a.x, xv.a.y, xv.a.z, xv.a.w, xv.b.x, xv.b.y, xv.b.z, xv.b.w};
#pragma unroll
                    for (int i = 0; i < 16; ++i)
                        xs[i] = __fmul_rn(__uint_as_float((i & 1) ? (xw[i >> 1] & 0xffff0000u) : (xw[i >> 1] << 16)),
                                          0x1p14f);
                }
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (r < valid) {
                        float p = BIG ? w4a16_chunk16(wb.c[t][r], xv) : w4a16_chunk16_f16(wb.c[t][r], xs);
                        acc[r] = __fmaf_rn(p, __fmul_rn(gscale, e4m3_to_f32(wb.s[t][r])), acc[r]);
                    }
            }
        }
    }
}

// The walk with every load after the caller's wait (the fused MoE forms' per-tile use).
template <int K, bool BIG>
__device__ __forceinline__ void w4a16_rows_partial(const uint8_t* codes, const uint8_t* scales,
                                                   float gscale, const uint4* x, int l, int valid,
                                                   float (&acc)[W4A16_ROWS]) {
    W4A16Batch unused;
    w4a16_rows_walk<K, BIG, false>(codes, scales, gscale, x, l, valid, acc, unused);
}

// Two-warp finish: shuffle tree per warp, then P0 + P1 -> BF16, for each of the group's rows.
__device__ __forceinline__ void w4a16_finish(float (&acc)[W4A16_ROWS], int grp, int l, int valid,
                                             __nv_bfloat16* y, float (*part)[W4A16_ROWS]) {
#pragma unroll
    for (int r = 0; r < W4A16_ROWS; ++r) {
        acc[r] = warp_sum_down(acc[r]);
        if (l == 32) part[grp][r] = acc[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < W4A16_ROWS; ++r)
        if (l == 0 && r < valid) y[r] = f32_to_bf16(__fadd_rn(acc[r], part[grp][r]));
}

// One CTA's share of a projection: 4 groups of 64 threads, W4A16_ROWS rows each. PDL: the first
// batch of weight loads is issued before pdl_wait() (the whole slice when K <= 4096), x and the
// choice of walk after it; TRIGGER: the dependents are released right after the wait (as in the
// fast forms, w4a16_mma.cuh).
template <int K, bool TRIGGER = true>
__device__ __forceinline__ void w4a16_cta(const uint8_t* codes, const uint8_t* scales, float gscale,
                                          const __nv_bfloat16* x, __nv_bfloat16* y, int N, int cta) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    __shared__ float part[4][W4A16_ROWS];
    const int grp = threadIdx.x >> 6, l = threadIdx.x & 63;
    const int n0 = (cta * 4 + grp) * W4A16_ROWS;
    const int valid = max(0, min(W4A16_ROWS, N - n0));
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    const uint8_t* codes_n0 = codes + (size_t)n0 * (K / 2);
    const uint8_t* scales_n0 = scales + (size_t)n0 * (K / 16);
    float acc[W4A16_ROWS];
    W4A16Batch first;
    w4a16_load_batch<K>(codes_n0, scales_n0, l, valid, 0, first);
    KBP_STAMP(kStampWaitIn);
    pdl_wait();   // PDL: x comes from the kernel before
    KBP_STAMP(kStampWaitOut);
    if (TRIGGER) pdl_launch_dependents();
    if (w4a16_x_big<K>(x4))  // uniform over the CTA
        w4a16_rows_walk<K, true, true>(codes_n0, scales_n0, gscale, x4, l, valid, acc, first);
    else
        w4a16_rows_walk<K, false, true>(codes_n0, scales_n0, gscale, x4, l, valid, acc, first);
    KBP_STAMP(3);   // the walk done (thread 0's rows accumulated), before the two-warp finish
    w4a16_finish(acc, grp, l, valid, y + n0, part);
}

template <int K>
__device__ __forceinline__ void w4a16_gemv_dev(const uint8_t* codes,
                                                  const uint8_t* scales, float gscale,
                                                  const __nv_bfloat16* x,
                                                  __nv_bfloat16* y, int N) {
    w4a16_cta<K>(codes, scales, gscale, x, y, N, blockIdx.x);
}

template <int K>
__global__ void __launch_bounds__(256) w4a16_gemv(const uint8_t* codes,
                                                  const uint8_t* scales, float gscale,
                                                  const __nv_bfloat16* x,
                                                  __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    // PDL: w4a16_cta waits once its first weight batch is in flight
    w4a16_gemv_dev<K>(codes, scales, gscale, x, y, N);
    KBP_STAMP_END();
}

template <int K>
__device__ __forceinline__ void w4a16_gemv_seg_dev(const W4A16Seg* table, int nseg,
                                                      const __nv_bfloat16* x) {
    // Find this CTA's segment: CTAs are handed out segment by segment, w4a16_ctas(n) each.
    int b = blockIdx.x, s = 0;
    while (s < nseg - 1 && b >= w4a16_ctas(table[s].n)) { b -= w4a16_ctas(table[s].n); ++s; }
    const W4A16Seg seg = table[s];
    w4a16_cta<K>(seg.codes, seg.scales, seg.gscale, x, seg.y, seg.n, b);
}

template <int K>
__global__ void __launch_bounds__(256) w4a16_gemv_seg(const W4A16Seg* table, int nseg,
                                                      const __nv_bfloat16* x) {
    KBP_STAMP_BEGIN();
    // PDL: w4a16_cta waits once its first weight batch is in flight
    w4a16_gemv_seg_dev<K>(table, nseg, x);
    KBP_STAMP_END();
}

// The segment table as a kernel parameter (NSEG <= W4A16_MAX_SEGS: 4 KB parameter limit to spare).
template <int NSEG>
struct W4A16SegList {
    W4A16Seg seg[NSEG];
};

template <int K, int NSEG>
__global__ void __launch_bounds__(256) w4a16_gemv_seg_list(const __grid_constant__ W4A16SegList<NSEG> segs,
                                                           const __nv_bfloat16* x) {
    // PDL: w4a16_cta waits once its first weight batch is in flight (the table is a parameter)
    static_assert(NSEG >= 1 && NSEG <= W4A16_MAX_SEGS, "segments per launch");
    KBP_STAMP_BEGIN();
    w4a16_gemv_seg_dev<K>(segs.seg, NSEG, x);
    KBP_STAMP_END();
}

// SiLU-input form, 8-value walk: x_k = f32(f32(g / f32(1 + expf(-g))) * u); w_k = f32(q * f32(s_g *
// s_nj)); thread l takes the 8-element vectors v = l, l+64, ...; acc = fma(x_k, w_k, acc).
__device__ __forceinline__ float silu_f32(float g) { return __fdiv_rn(g, __fadd_rn(1.0f, kbp::exp_f32(-g))); }

// Thread l's weights for its first W4A16_BATCH 8-value vectors of the group's rows (the silu walk's
// first batch), loaded before the dependency wait by w4a16_silu_input_impl.
struct W4A16SiluBatch {
    uint32_t c[W4A16_BATCH][W4A16_ROWS];
    uint8_t s[W4A16_BATCH][W4A16_ROWS];
};

template <int K>
__device__ __forceinline__ void w4a16_silu_load_batch(const uint8_t* codes, const uint8_t* scales, int l,
                                                      int valid, int b0, W4A16SiluBatch& b) {
    constexpr int NV = K / 8, PER = (NV + 63) / 64, R = W4A16_ROWS;
#pragma unroll
    for (int t = 0; t < W4A16_BATCH; ++t) {
        const int v = l + 64 * (b0 + t);
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (b0 + t < PER && v < NV && r < valid) {
                b.c[t][r] = ld_weight(reinterpret_cast<const uint32_t*>(codes + (size_t)r * (K / 2)) + v);
                b.s[t][r] = ld_weight(scales + (size_t)r * (K / 16) + (v >> 1));
            }
    }
}

// Thread l's accumulators for the group's rows; xs = the FP32 input staged in shared memory (the
// walk's first __syncthreads publishes it). PRELOADED: `first` holds the first batch, in flight.
template <int K, bool PRELOADED>
__device__ __forceinline__ void w4a16_silu_walk(const uint8_t* codes, const uint8_t* scales,
                                                float gscale, const float* xs, int l, int valid,
                                                float (&acc)[W4A16_ROWS], const W4A16SiluBatch& first) {
    constexpr int NV = K / 8, PER = (NV + 63) / 64, R = W4A16_ROWS;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int b0 = 0; b0 < PER; b0 += W4A16_BATCH) {
        W4A16SiluBatch wb;
        if (PRELOADED && b0 == 0) wb = first;
        else w4a16_silu_load_batch<K>(codes, scales, l, valid, b0, wb);
        if (b0 == 0) __syncthreads();  // xs staged (the first loads are already in flight)
#pragma unroll
        for (int t = 0; t < W4A16_BATCH; ++t) {
            const int v = l + 64 * (b0 + t);
            if (b0 + t < PER && v < NV) {
                const float4 xa = reinterpret_cast<const float4*>(xs)[2 * v];
                const float4 xb = reinterpret_cast<const float4*>(xs)[2 * v + 1];
                const float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                for (int r = 0; r < R; ++r)
                    if (r < valid) {
                        const float sc = __fmul_rn(gscale, e4m3_to_f32(wb.s[t][r]));
#pragma unroll
                        for (int i = 0; i < 8; ++i)
                            acc[r] = __fmaf_rn(xv[i], __fmul_rn(e2m1_at(wb.c[t][r], 4 * i), sc), acc[r]);
                    }
            }
        }
    }
}

// The walk with every load after the caller's wait (the fused MoE forms' use).
template <int K>
__device__ __forceinline__ void w4a16_silu_rows(const uint8_t* codes, const uint8_t* scales,
                                                float gscale, const float* xs, int l, int valid,
                                                float (&acc)[W4A16_ROWS]) {
    W4A16SiluBatch unused;
    w4a16_silu_walk<K, false>(codes, scales, gscale, xs, l, valid, acc, unused);
}

// CLAMP: g^ = fminf(g, L), u^ = fminf(fmaxf(u, -L), L) first (exact; NaN -> the other operand).
// PDL: the first weight batch is issued before pdl_wait() (the whole slice when K <= 4096), g and u
// are read after it; TRIGGER: the dependents are released right after the wait.
template <int K, bool CLAMP, bool TRIGGER = true>
__device__ __forceinline__ void w4a16_silu_input_impl(const uint8_t* codes,
                                                      const uint8_t* scales, float gscale,
                                                      const __nv_bfloat16* g,
                                                      const __nv_bfloat16* u, float limit,
                                                      __nv_bfloat16* y, int N) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    static_assert(K * 4 <= 40960, "the FP32 input is staged in static shared memory");
    __shared__ __align__(16) float xs[K];
    __shared__ float part[4][W4A16_ROWS];
    const int grp = threadIdx.x >> 6, l = threadIdx.x & 63;
    const int n0 = (blockIdx.x * 4 + grp) * W4A16_ROWS;
    const int valid = max(0, min(W4A16_ROWS, N - n0));
    const uint8_t* codes_n0 = codes + (size_t)n0 * (K / 2);
    const uint8_t* scales_n0 = scales + (size_t)n0 * (K / 16);
    W4A16SiluBatch first;
    w4a16_silu_load_batch<K>(codes_n0, scales_n0, l, valid, 0, first);
    KBP_STAMP(kStampWaitIn);
    pdl_wait();   // PDL: g and u come from the kernel before
    KBP_STAMP(kStampWaitOut);
    if (TRIGGER) pdl_launch_dependents();
    for (int k = threadIdx.x; k < K; k += 256) {  // x_k = silu(g_k) * u_k, once per CTA
        float gk = __bfloat162float(g[k]), uk = __bfloat162float(u[k]);
        if (CLAMP) { gk = fminf(gk, limit); uk = fminf(fmaxf(uk, -limit), limit); }
        xs[k] = __fmul_rn(silu_f32(gk), uk);
    }
    float acc[W4A16_ROWS];
    w4a16_silu_walk<K, true>(codes_n0, scales_n0, gscale, xs, l, valid, acc, first);
    KBP_STAMP(3);   // the walk done (thread 0's rows accumulated), before the two-warp finish
    w4a16_finish(acc, grp, l, valid, y + n0, part);
}

template <int K>
__device__ __forceinline__ void w4a16_gemv_silu_input_dev(const uint8_t* codes,
                                                          const uint8_t* scales, float gscale,
                                                          const __nv_bfloat16* g,
                                                          const __nv_bfloat16* u,
                                                          __nv_bfloat16* y, int N) {
    w4a16_silu_input_impl<K, false>(codes, scales, gscale, g, u, 0.0f, y, N);
}

template <int K>
__device__ __forceinline__ void w4a16_gemv_silu_clamp_input_dev(const uint8_t* codes,
                                                                const uint8_t* scales, float gscale,
                                                                const __nv_bfloat16* g,
                                                                const __nv_bfloat16* u, float limit,
                                                                __nv_bfloat16* y, int N) {
    w4a16_silu_input_impl<K, true>(codes, scales, gscale, g, u, limit, y, N);
}

template <int K>
__global__ void __launch_bounds__(256) w4a16_gemv_silu_clamp_input(const uint8_t* codes,
                                                                   const uint8_t* scales, float gscale,
                                                                   const __nv_bfloat16* g,
                                                                   const __nv_bfloat16* u, float limit,
                                                                   __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    // PDL: w4a16_silu_input_impl waits once its first weight batch is in flight
    w4a16_gemv_silu_clamp_input_dev<K>(codes, scales, gscale, g, u, limit, y, N);
    KBP_STAMP_END();
}

template <int K>
__global__ void __launch_bounds__(256) w4a16_gemv_silu_input(const uint8_t* codes,
                                                             const uint8_t* scales, float gscale,
                                                             const __nv_bfloat16* g,
                                                             const __nv_bfloat16* u,
                                                             __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    // PDL: w4a16_silu_input_impl waits once its first weight batch is in flight
    w4a16_gemv_silu_input_dev<K>(codes, scales, gscale, g, u, y, N);
    KBP_STAMP_END();
}

// ------------------------------------------------------------------ shared expert pair

// Whether the pair's phases release their dependents after their wait. Off: phase 1, launched
// after phase 0 on the shared expert's stream, would take SMs beside the routed experts' GEMVs
// early (H200, 128-expert seed shrink, fast build, replay timelines: a MoE sublayer 56.15 us with
// the trigger against 55.72 without and 55.73 before this form; the step even within the spread).
constexpr bool kW4A16PairTrigger = false;

namespace {  // internal linkage: each TU (kernel instance) owns its scratch
template <int N>
__device__ __nv_bfloat16 w4a16_pair_scratch[N];
}  // namespace

template <int K, int I>
__device__ __forceinline__ void w4a16_shared_pair_dev(int phase, const uint8_t* gu_codes,
                                                      const uint8_t* gu_scales, float gu_gscale,
                                                      const __nv_bfloat16* x,
                                                      const uint8_t* dn_codes,
                                                      const uint8_t* dn_scales, float dn_gscale,
                                                      float limit, __nv_bfloat16* y, int N) {
    __nv_bfloat16* gu = w4a16_pair_scratch<2 * I>;
    if (phase == 0)  // uniform per launch
        w4a16_cta<K, kW4A16PairTrigger>(gu_codes, gu_scales, gu_gscale, x, gu, 2 * I, blockIdx.x);
    else
        w4a16_silu_input_impl<I, true, kW4A16PairTrigger>(dn_codes, dn_scales, dn_gscale, gu, gu + I, limit, y, N);
}

template <int K, int I>
__global__ void __launch_bounds__(256) w4a16_shared_pair(int phase, const uint8_t* gu_codes,
                                                         const uint8_t* gu_scales, float gu_gscale,
                                                         const __nv_bfloat16* x,
                                                         const uint8_t* dn_codes,
                                                         const uint8_t* dn_scales, float dn_gscale,
                                                         float limit, __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    // PDL: each phase waits once its first weight batch is in flight
    w4a16_shared_pair_dev<K, I>(phase, gu_codes, gu_scales, gu_gscale, x, dn_codes, dn_scales, dn_gscale,
                                limit, y, N);
    KBP_STAMP_END();
}

}  // namespace kbp
