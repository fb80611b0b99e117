// w4a4_mx.cuh: W4A4 one-row GEMV with per-row NVFP4 activations (family w4a4_mx).
//
// Formats (plain layout, as the checkpoint stores them): weight codes (N, K/2) uint8 (two E2M1 per
// byte, even element in the low nibble), scales (N, K/16) E4M3, FP32 tensor scale s_g; activation
// row: codes (K/2), scales (K/16), global g_t (FP32) -- what w4a4_quant_rows writes.
//
// Entries:
//   w4a4_quant_rows<K>(x, a_codes, a_scales, a_g)    grid = (m rows, S), block 256, no smem args
//       x (m, K) BF16 -> codes (m, K/2), scales (m, K/16), g (m,). K % 16 == 0. Any S >= 1: the S
//       CTAs of a row each read the whole row for its max and quantize every S-th run of 256
//       values; S = ceil(K / 256) (one value a thread) is the fastest.
//   w4a4_gemv<K, FAST>(a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, y, N)
//       grid = N/16, block 256; N % 16 == 0, K % 128 == 0, K <= W4A4_MAX_K, 16-byte aligned rows.
//       One activation row. FAST (numerics fast): FP32 accumulation of the group terms instead of
//       the exact chunk sums, within kbpc.reference.gemv_bounds.w4a4_fast_bound of the reference.
//       PDL: the CTA's weight loads are issued before pdl_wait().
// Math (explain.families.w4a4_mx): quantization exactly as the numerics text (order in
//   kbpc/reference/formats.quantize_nvfp4_rows). Product: a CTA owns 16 weight rows; warp w takes
//   the 128-wide chunks c = w (mod 8) in increasing order; each chunk sum S_c of the block-scaled
//   products (q s^w)(a s^a) is formed EXACTLY and folded with one rounding acc = f32(acc + S_c); the
//   8 warp partials are added in warp order, times f32(g_t * s_g), rounded once to BF16.
//   Bit-exact with kbpc.reference.w4a4_mx on every architecture (the exact form; see w4a4_rows_dot).
// How (no FP4 MMA on sm_90): E2M1 values times 2 are the integers {0,1,2,3,4,6,8,12}; PRMT turns
//   4 codes into 4 magnitude bytes (its sign-replicate mode zeroes the bytes of the other sign), so
//   two DP4As give the exact integer dot product of a 16-value group; times the exact FP32 scale
//   product s^w s^a and summed over the chunk in FP64 this is exact (terms are multiples of 2^-20
//   below 2^30). The block-scaled FP4 MMA of sm_120/sm_121 (kbp::mma_mxf4nvf4_m16n8k64 below) is
//   kept as a building block; the GEMVs use the exact path everywhere because the MMA's internal
//   accumulation is unspecified (and sm_12x parts are far more bandwidth- than compute-bound).
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
#pragma once

#include "kbp_common.cuh"

namespace kbp {

constexpr uint32_t E2M1X2_LO = 0x03020100u;  // 2*|q| for magnitude codes 0..3
constexpr uint32_t E2M1X2_HI = 0x0C080604u;  // 2*|q| for magnitude codes 4..7

// PTX prmt in its default mode: selector bit 3 replicates the chosen byte's sign bit instead
// (CUDA's __byte_perm is not documented to keep that bit, so the instruction is spelled out).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
// Bytes 2|q| of the 4 codes in sel's low 16 bits: positive codes only, negative ones give 0
// (their set sign bit selects the replicate mode, and every table byte is below 0x80).
__device__ __forceinline__ uint32_t e2m1x2_pos(uint32_t sel) { return prmt(E2M1X2_LO, E2M1X2_HI, sel); }
// Same for the negative codes (sign bits flipped first).
__device__ __forceinline__ uint32_t e2m1x2_neg(uint32_t sel) { return prmt(E2M1X2_LO, E2M1X2_HI, sel ^ 0x8888u); }

// Signed bytes 2q of the 4 codes in sel's low 16 bits (activations, decoded once per CTA).
__device__ __forceinline__ uint32_t e2m1x2_signed(uint32_t sel) { return __vsub4(e2m1x2_pos(sel), e2m1x2_neg(sel)); }

// 4 * sum of the 8 products q*a of one code word (8 weight codes) with 8 signed activation bytes.
__device__ __forceinline__ int e2m1_dot8(uint32_t w, uint32_t a_lo, uint32_t a_hi, int acc) {
    uint32_t hi = w >> 16;
    acc = __dp4a((int)e2m1x2_pos(w), (int)a_lo, acc);
    acc -= __dp4a((int)e2m1x2_neg(w), (int)a_lo, 0);
    acc = __dp4a((int)e2m1x2_pos(hi), (int)a_hi, acc);
    acc -= __dp4a((int)e2m1x2_neg(hi), (int)a_hi, 0);
    return acc;
}

#if defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL)
// Block-scaled FP4 MMA (sm_120a/sm_121a): d += (A 16x64 E2M1, 4 UE4M3 scales per row) x (B 64x8).
__device__ __forceinline__ void mma_mxf4nvf4_m16n8k64(float (&d)[4], const uint32_t (&a)[4],
                                                      const uint32_t (&b)[2], uint32_t sa, uint32_t sb) {
    asm volatile(
        "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {%11,%12}, %13, {%11,%12};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(sa),
          "h"((uint16_t)0), "h"((uint16_t)0), "r"(sb));
}
#endif

// ------------------------------------------------------------------ activation quantization

// A group's E4M3 scale byte from its max |v| (1/g = inv_g), and a value's E2M1 code under the
// decoded scale s (denom = s * g): the one home of the NVFP4 activation math.
__device__ __forceinline__ uint8_t nvfp4_group_scale(float m, float inv_g) {
    return f32_to_e4m3(__fmul_rn(__fdiv_rn(m, 6.0f), inv_g));
}
__device__ __forceinline__ uint32_t nvfp4_code(float v, float s, float denom) {
    return s == 0.0f ? 0u : f32_to_e2m1(__fdiv_rn(v, denom));
}

// Quantize one row held as (GPT groups per thread) x 16 FP32 values; g is the row's global scale.
__device__ __forceinline__ void nvfp4_quant_group(const float (&v)[16], float g, float inv_g,
                                                  uint8_t* codes, uint8_t* scale) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
    uint8_t sc = nvfp4_group_scale(m, inv_g);
    float s = e4m3_to_f32(sc), denom = __fmul_rn(s, g);
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i >> 3] |= nvfp4_code(v[i], s, denom) << (4 * (i & 7));
    *reinterpret_cast<uint2*>(codes) = make_uint2(w[0], w[1]);
    *scale = sc;
}

// One NVFP4 group held one value per lane by 16 consecutive lanes (lane16 = lane % 16): what
// nvfp4_quant_group does to the 16 values, spread so that each lane pays one value's latency. The
// group max over the 16 lanes is exact in any order; the scale and each value's code are
// nvfp4_quant_group's (nvfp4_group_scale, nvfp4_code); the codes are packed by an OR over 8-lane
// runs. Lane 0 of the 16 stores the 8 code bytes and the scale byte. All 16 lanes of the half-warp
// (threadIdx.x & 16) must call it together.
__device__ __forceinline__ void nvfp4_quant_group_lanes(float v, int lane16, float g, float inv_g,
                                                        uint8_t* codes, uint8_t* scale) {
    const unsigned half = 0xffffu << (threadIdx.x & 16);
    float m = fabsf(v);
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(half, m, off));
    const uint8_t sc = nvfp4_group_scale(m, inv_g);
    const float s = e4m3_to_f32(sc), denom = __fmul_rn(s, g);
    uint32_t w = nvfp4_code(v, s, denom) << (4 * (lane16 & 7));
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) w |= __shfl_xor_sync(half, w, off);
    const uint32_t hi = __shfl_down_sync(half, w, 8);
    if (lane16 == 0) {
        *reinterpret_cast<uint2*>(codes) = make_uint2(w, hi);
        *scale = sc;
    }
}

// Block-wide max of non-negative values (exact in any order); every thread gets the result.
__device__ __forceinline__ float block_max256(float m, float* red) {
    m = warp_max_xor(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) m = fmaxf(m, red[i]);
    return m;
}

// 16 BF16 values widened exactly. L2_ONLY: through L2 (ld.global.cg), for a row other CTAs of the
// same grid wrote (no wait made this SM's L1 current); else kbp::ld_step (step data).
template <bool L2_ONLY = false>
__device__ __forceinline__ void bf16x16_load(const __nv_bfloat16* p, float (&v)[16]) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
    uint4 a = L2_ONLY ? __ldcg(q) : ld_step(q), b = L2_ONLY ? __ldcg(q + 1) : ld_step(q + 1);
    const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) { v[2 * i] = __uint_as_float(u[i] << 16); v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
}

// Group j (16 values) of the BF16 row x quantized with global scale g (1/g = inv_g) into the row's
// codes (8 bytes at 8j) and scales (byte j): nvfp4_quant_group of that group, for kernels that
// spread a row's groups over other threads (the fused MoE layer's router).
__device__ __forceinline__ void nvfp4_quant_row_group(const __nv_bfloat16* x, int j, float g, float inv_g,
                                                      uint8_t* codes, uint8_t* scales) {
    float v[16];
    bf16x16_load(x + 16 * j, v);
    nvfp4_quant_group(v, g, inv_g, codes + 8 * j, scales + j);
}

// Row blockIdx.x's dynamic NVFP4 quantization by the gridDim.y CTAs of the row: each reads the
// whole row for max |x| (exact in any order: the same g in every CTA), then quantizes values
// i = blockIdx.y * 256 + threadIdx.x (+ gridDim.y * 256 ...), a 16-value group over 16 lanes
// (nvfp4_quant_group_lanes): nvfp4_quant_group's bytes. One CTA quantizing 16 values a thread in
// series is a latency chain of its own: on an H200 the same form in the fused router ended it
// 2.6 us later in the step than one value a thread.
template <int K>
__device__ __forceinline__ void w4a4_quant_rows_dev(const __nv_bfloat16* x,
                                                       uint8_t* a_codes,
                                                       uint8_t* a_scales,
                                                       float* a_g) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    constexpr int NV = K / 8, PER = (NV + 255) / 256;
    __shared__ float red[8];
    const size_t r = blockIdx.x;
    const __nv_bfloat16* xr = x + r * K;
    float m = 0.0f;
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int vi = threadIdx.x + 256 * p;
        if (vi < NV) {
            const uint4 u = ld_step(reinterpret_cast<const uint4*>(xr) + vi);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; ++j)
                m = fmaxf(fmaxf(m, fabsf(__uint_as_float(w[j] << 16))), fabsf(__uint_as_float(w[j] & 0xffff0000u)));
        }
    }
    const float amax = block_max256(m, red);
    const float g = amax > 0.0f ? __fdiv_rn(amax, 6.0f * 448.0f) : 1.0f;
    const float inv_g = __fdiv_rn(1.0f, g);
    // K % 16 == 0 and 256 % 16 == 0: the 16 lanes of a group enter and leave the loop together.
    for (int i = blockIdx.y * 256 + threadIdx.x; i < K; i += gridDim.y * 256)
        nvfp4_quant_group_lanes(bf16_to_f32(ld_step(xr + i)), threadIdx.x & 15, g, inv_g,
                                a_codes + r * (K / 2) + 8 * (i / 16), a_scales + r * (K / 16) + i / 16);
    if (blockIdx.y == 0 && threadIdx.x == 0) a_g[r] = g;
}

template <int K>
__global__ void __launch_bounds__(256) w4a4_quant_rows(const __nv_bfloat16* x,
                                                       uint8_t* a_codes,
                                                       uint8_t* a_scales,
                                                       float* a_g) {
    KBP_STAMP_BEGIN();   // phase stamps of a profiling build (kbp_stamps.cuh): begin, the wait, end
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    w4a4_quant_rows_dev<K>(x, a_codes, a_scales, a_g);
    KBP_STAMP_END();
}

// ------------------------------------------------------------------ the product

// Shared staging of one activation row: signed bytes 2a (K) and decoded group scales (K/16).
// W4A4_MAX_K: the widest row whose staging fits the 48 KB of static shared memory.
template <int K>
struct W4A4Smem {
    uint4 a[K / 16];
    float s[K / 16];
    float part[8][16];
};
constexpr int W4A4_MAX_K = 38912;

// Group j of an activation row from its 8 code bytes w and scale byte.
template <int K>
__device__ __forceinline__ void w4a4_stage_group(W4A4Smem<K>& sm, int j, uint2 w, uint8_t scale) {
    sm.a[j] = make_uint4(e2m1x2_signed(w.x), e2m1x2_signed(w.x >> 16), e2m1x2_signed(w.y), e2m1x2_signed(w.y >> 16));
    sm.s[j] = e4m3_to_f32(scale);
}

template <int K>
__device__ __forceinline__ void w4a4_stage_act(const uint8_t* a_codes, const uint8_t* a_scales,
                                               W4A4Smem<K>& sm) {
    static_assert(K <= W4A4_MAX_K, "the activation staging must fit static shared memory");
    const uint2* c = reinterpret_cast<const uint2*>(a_codes);
    for (int j = threadIdx.x; j < K / 16; j += 256) w4a4_stage_group(sm, j, ld_step(c + j), ld_step(a_scales + j));
}

// Warp-level chunk walk for 16 rows, in two steps so that a kernel can put its weight loads in
// flight before what it waits for (pdl_wait, the activation staging): w4a4_load_rows issues the
// lane's loads, w4a4_rows_dot (after the staging's __syncthreads) consumes them. Lane 2r + h takes
// row r's groups 4h..4h+3 of each chunk (32 contiguous code bytes and 4 scale bytes). Returns the
// row's FP32 accumulator (both lanes of a pair hold it).
//   exact (FAST false): each chunk sum S_c is formed exactly in FP64 (group dot products are exact
//     integers, times exact FP32 scale products: exact in any order, so the lane split is free)
//     and folded with one rounding, acc = f32(acc + S_c): the reference's bits.
//   fast: the group terms (each exact in FP32) are accumulated in FP32 by one FMA each in the
//     lane's order, the two lanes' sums added at the end, times 1/4 (exact): within
//     kbpc.reference.gemv_bounds.w4a4_fast_bound of the reference.
// Measured on the H200 (bench/results/s7-kernels-w4a4-forms.json, MoE gate/up, 8 slots): the fast
// form 24.8-25.0 us against 26.3 exact; loading each lane's 16-byte quarters h and 2 + h (whole
// sectors a load) with a scale shuffle cost 1.5 us, staging -2a beside 2a to drop the subtractions
// cost 1.2 us, loading before or after the staging is even.
template <int K>
struct W4A4Rows {
    static constexpr int NCH = K / 128, PER = (NCH + 7) / 8;
    uint4 cw[PER][2];
    uint32_t sw[PER];
};

template <int K>
__device__ __forceinline__ void w4a4_load_rows(W4A4Rows<K>& w, const uint8_t* w_codes, const uint8_t* w_scales,
                                               int warp, int lane) {
    const int r = lane >> 1, h = lane & 1;
    const uint4* wc = reinterpret_cast<const uint4*>(w_codes + (size_t)r * (K / 2)) + 2 * h;
    const uint32_t* ws = reinterpret_cast<const uint32_t*>(w_scales + (size_t)r * (K / 16)) + h;
#pragma unroll
    for (int i = 0; i < W4A4Rows<K>::PER; ++i) {  // every weight load of this lane is in flight before any math
        const int c = warp + 8 * i;
        if (c < W4A4Rows<K>::NCH) {
            w.cw[i][0] = ld_weight(wc + 4 * c);
            w.cw[i][1] = ld_weight(wc + 4 * c + 1);
            w.sw[i] = ld_weight(ws + 2 * c);
        }
    }
}

template <int K, bool FAST = false>
__device__ __forceinline__ float w4a4_rows_dot(const W4A4Rows<K>& w, const W4A4Smem<K>& sm, int warp, int lane) {
    const int h = lane & 1;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < W4A4Rows<K>::PER; ++i) {
        const int c = warp + 8 * i;
        if (c >= W4A4Rows<K>::NCH) break;
        const uint32_t wv[8] = {w.cw[i][0].x, w.cw[i][0].y, w.cw[i][0].z, w.cw[i][0].w,
                                w.cw[i][1].x, w.cw[i][1].y, w.cw[i][1].z, w.cw[i][1].w};
        double s = 0.0;
#pragma unroll
        for (int gq = 0; gq < 4; ++gq) {
            const int grp = 8 * c + 4 * h + gq;
            const uint4 a = sm.a[grp];
            int d = e2m1_dot8(wv[2 * gq], a.x, a.y, 0);
            d = e2m1_dot8(wv[2 * gq + 1], a.z, a.w, d);
            const float sc = __fmul_rn(e4m3_to_f32((uint8_t)(w.sw[i] >> (8 * gq))), sm.s[grp]);
            if constexpr (FAST) acc = __fmaf_rn((float)d, sc, acc);
            else s = __dadd_rn(s, (double)__fmul_rn((float)d, sc));  // exact: 12 x 8 bits
        }
        if constexpr (!FAST) {
            s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));  // exact (see header)
            acc = add_f32_exact(acc, 0.25 * s);
        }
    }
    if constexpr (FAST) acc = 0.25f * __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 1));
    return acc;
}

// The 16 rows' sums of the warp partials, in warp order: thread r < 16 gets row r's (every thread
// of the CTA calls it; the others get 0).
__device__ __forceinline__ float w4a4_row_sum(float acc, float (*part)[16], int warp, int lane) {
    if ((lane & 1) == 0) part[warp][lane >> 1] = acc;
    __syncthreads();
    float p = 0.0f;
    if (threadIdx.x < 16) {
        p = part[0][threadIdx.x];
#pragma unroll
        for (int w = 1; w < 8; ++w) p = __fadd_rn(p, part[w][threadIdx.x]);
    }
    return p;
}

// Warp partials in warp order, times f32(g_t * s_g), one BF16 rounding.
__device__ __forceinline__ void w4a4_finish(float acc, float (*part)[16], float scale,
                                            __nv_bfloat16* y, int warp, int lane) {
    const float p = w4a4_row_sum(acc, part, warp, lane);
    if (threadIdx.x < 16) y[threadIdx.x] = f32_to_bf16(__fmul_rn(p, scale));
}

// Resident CTAs per SM a one-tile W4A4 GEMV asks the register allocator for (MIN_CTAS of the
// __global__ entries): it streams at the rate of the weight bytes in flight per SM (H200, MoE gate_up
// 8 x 4096x4096: 26.5 us at 3 CTAs per SM with 79 registers). Four CTAs fit in 64 registers without
// spills while a lane holds at most four chunks (K <= 4096); wider rows keep two.
template <int K>
constexpr int w4a4_min_ctas() { return (K / 128 + 7) / 8 <= 4 ? 4 : 2; }

template <int K, bool FAST = false>
__device__ __forceinline__ void w4a4_gemv_dev(const uint8_t* a_codes,
                                                 const uint8_t* a_scales,
                                                 const float* a_g,
                                                 const uint8_t* w_codes,
                                                 const uint8_t* w_scales, float w_gscale,
                                                 __nv_bfloat16* y, int N) {
    static_assert(K % 128 == 0, "w4a4_gemv walks K in 128-wide chunks");
    __shared__ W4A4Smem<K> sm;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t n0 = (size_t)blockIdx.x * 16;
    W4A4Rows<K> w;
    w4a4_load_rows<K>(w, w_codes + n0 * (K / 2), w_scales + n0 * (K / 16), warp, lane);
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: the weights are in flight; the activation row comes from the previous kernel
    KBP_STAMP(kStampWaitOut);
    w4a4_stage_act<K>(a_codes, a_scales, sm);
    __syncthreads();
    const float acc = w4a4_rows_dot<K, FAST>(w, sm, warp, lane);
    w4a4_finish(acc, sm.part, __fmul_rn(ld_step(a_g), w_gscale), y + n0, warp, lane);
}

template <int K, bool FAST = false, int MIN_CTAS = w4a4_min_ctas<K>()>
__global__ void __launch_bounds__(256, MIN_CTAS) w4a4_gemv(const uint8_t* a_codes,
                                                 const uint8_t* a_scales,
                                                 const float* a_g,
                                                 const uint8_t* w_codes,
                                                 const uint8_t* w_scales, float w_gscale,
                                                 __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();   // phase stamps of a profiling build (kbp_stamps.cuh): begin, the wait, end
    w4a4_gemv_dev<K, FAST>(a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, y, N);   // waits inside (PDL)
    KBP_STAMP_END();
}

}  // namespace kbp
