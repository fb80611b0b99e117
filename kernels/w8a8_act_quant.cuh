// w8a8_act_quant.cuh: dynamic FP8 E4M3 activation quantizers (family w8a8_act_quant).
//
// Entries (256-thread CTAs, grid = m rows, no dynamic smem; rows 16-byte aligned):
//   w8a8_act_quant_row<K, SPLIT = 1>(x, q, s) per token: q (m, K) E4M3 codes, s (m,) FP32.  K % 8 == 0
//                                             grid (m, SPLIT): SPLIT CTAs per row (quant_row_impl)
//   w8a8_act_quant_g128<K>(x, q, s)           per 128 group: s (m, K/128).                K % 128 == 0
//   w8a8_act_quant_silu_row<K>(g, u, q, s)    input v = rn_bf16((g * sigma(g)) * u)
//   w8a8_act_quant_silu_g128<K>(g, u, q, s)
// Math (explain.families.w8a8_act_quant): s = max(f32(max|v| / 448), 1e-12) (exact max, correctly
//   rounded division), q = sat_e4m3(clamp(f32(v / s), -448, 448)). sigma(g) = 1 / (1 + __expf(-g))
//   (the fast exponential the family names; the reference uses a correctly rounded exp, so the
//   silu forms agree within the GPU test's tolerance and the plain forms bit-exactly).
// Layout: thread t owns the 8-element vectors t, t+256, ...; the per-token form keeps the whole
//   row in registers (read once); the g128 form gives each 128-group 16 threads (one vector each),
//   reduced with xor shuffles over the 16 lanes.
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
#pragma once

#include "kbp_common.cuh"

namespace kbp {

__device__ __forceinline__ void bf16x8_unpack(uint4 u, float (&v)[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); }
}

// v = rn_bf16((g * sigma(g)) * u), left to right, no FMA.
__device__ __forceinline__ float silu_mul_bf16(float g, float u) {
    float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, kbp::exp_f32(-g)));
    return round_bf16(__fmul_rn(__fmul_rn(g, sig), u));
}

// Eight activations of vector j: plain BF16 or the SiLU-times-up product.
template <bool SILU>
__device__ __forceinline__ void act8_load(const __nv_bfloat16* x, const __nv_bfloat16* u, int j, float (&v)[8]) {
    bf16x8_unpack(ld_step(reinterpret_cast<const uint4*>(x) + j), v);
    if (SILU) {
        float uv[8];
        bf16x8_unpack(ld_step(reinterpret_cast<const uint4*>(u) + j), uv);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = silu_mul_bf16(v[i], uv[i]);
    }
}

__device__ __forceinline__ float fp8_scale(float amax) { return fmaxf(__fdiv_rn(amax, 448.0f), 1e-12f); }

__device__ __forceinline__ uint2 fp8_encode8(const float (&v)[8], float s) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        float r = fminf(fmaxf(__fdiv_rn(v[i], s), -448.0f), 448.0f);
        w[i >> 2] |= (uint32_t)f32_to_e4m3(r) << (8 * (i & 3));
    }
    return make_uint2(w[0], w[1]);
}

// SPLIT CTAs share a row (blockIdx.y): each reads the whole row for the exact max (the same value
// in every CTA) and encodes the vectors of its own PER-slices j with j % SPLIT == blockIdx.y. The
// encoding (a correctly rounded division per value) is the latency; the row's re-reads hit L2.
template <int K, bool SILU, int SPLIT = 1>
__device__ __forceinline__ void quant_row_impl(const __nv_bfloat16* x, const __nv_bfloat16* u,
                                               uint8_t* q, float* s_out) {
    static_assert(K % 8 == 0, "rows are read as 8-element vectors");
    constexpr int NV = K / 8, PER = (NV + 255) / 256;
    static_assert(SPLIT >= 1 && SPLIT <= PER, "at most one CTA per 256-vector slice");
    __shared__ float red[8];
    float v[PER][8], m = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int vi = threadIdx.x + 256 * j;
        if (vi < NV) {
            act8_load<SILU>(x, u, vi, v[j]);
#pragma unroll
            for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[j][i]));
        }
    }
    m = warp_max_xor(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) m = fmaxf(m, red[i]);
    const float s = fp8_scale(m);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        int vi = threadIdx.x + 256 * j;
        if (vi < NV && (SPLIT == 1 || j % SPLIT == (int)blockIdx.y)) reinterpret_cast<uint2*>(q)[vi] = fp8_encode8(v[j], s);
    }
    if (threadIdx.x == 0 && (SPLIT == 1 || blockIdx.y == 0)) *s_out = s;
}

template <int K, bool SILU>
__device__ __forceinline__ void quant_g128_impl(const __nv_bfloat16* x, const __nv_bfloat16* u,
                                                uint8_t* q, float* s_out) {
    static_assert(K % 128 == 0, "groups are 128 wide");
    constexpr int NV = K / 8;
    // 16 consecutive threads = one group; NV % 16 == 0, so a half-warp is always all in or all out.
    const unsigned half = 0xffffu << (threadIdx.x & 16);
    for (int vi = threadIdx.x; vi < NV; vi += 256) {
        float v[8], m = 0.0f;
        act8_load<SILU>(x, u, vi, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(half, m, off));
        const float s = fp8_scale(m);
        reinterpret_cast<uint2*>(q)[vi] = fp8_encode8(v, s);
        if ((vi & 15) == 0) s_out[vi >> 4] = s;
    }
}

template <int K, int SPLIT = 1>
__device__ __forceinline__ void w8a8_act_quant_row_dev(const __nv_bfloat16* x,
                                                          uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_row_impl<K, false, SPLIT>(x + r * K, nullptr, q + r * K, s + r);
}

template <int K, int SPLIT = 1>
__global__ void __launch_bounds__(256) w8a8_act_quant_row(const __nv_bfloat16* x,
                                                          uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_row_dev<K, SPLIT>(x, q, s);
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_g128_dev(const __nv_bfloat16* x,
                                                           uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_g128_impl<K, false>(x + r * K, nullptr, q + r * K, s + r * (K / 128));
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_g128(const __nv_bfloat16* x,
                                                           uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_g128_dev<K>(x, q, s);
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_silu_row_dev(const __nv_bfloat16* g,
                                                               const __nv_bfloat16* u,
                                                               uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_row_impl<K, true>(g + r * K, u + r * K, q + r * K, s + r);
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_silu_row(const __nv_bfloat16* g,
                                                               const __nv_bfloat16* u,
                                                               uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_silu_row_dev<K>(g, u, q, s);
}

template <int K>
__device__ __forceinline__ void w8a8_act_quant_silu_g128_dev(const __nv_bfloat16* g,
                                                                const __nv_bfloat16* u,
                                                                uint8_t* q, float* s) {
    const size_t r = blockIdx.x;
    quant_g128_impl<K, true>(g + r * K, u + r * K, q + r * K, s + r * (K / 128));
}

template <int K>
__global__ void __launch_bounds__(256) w8a8_act_quant_silu_g128(const __nv_bfloat16* g,
                                                                const __nv_bfloat16* u,
                                                                uint8_t* q, float* s) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w8a8_act_quant_silu_g128_dev<K>(g, u, q, s);
}

}  // namespace kbp
