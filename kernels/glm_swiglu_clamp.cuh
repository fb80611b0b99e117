// glm_swiglu_clamp.cuh: GLM-5's clamped SwiGLU (explain.families.glm_swiglu_clamp).
//
// Launch contract
//   kbp::swiglu_clamp<INTER, VEC, OUT, ZERO_FILL>(gate, up, in_stride, out, out_stride, limit,
//                                                 zero_buf, zero_words)
//     Row r: gate + r*in_stride and up + r*in_stride (BF16, INTER elements each; a [gate | up]
//     gate_up row is gate = gu, up = gu + INTER, in_stride = 2*INTER), out + r*out_stride
//     (OUT = SwiGluOut::kBF16 or kF32, INTER elements). Strides in elements.
//     grid (ceil(INTER / (block*VEC)), rows), any block size; INTER % VEC == 0, rows and strides
//     aligned to VEC elements (VEC in 1, 2, 4, 8).
//     ZERO_FILL: the grid also stores 0.0f to zero_buf[0 .. zero_words) (the routed down
//     projection's FP32 accumulation buffer; 16-byte aligned), else zero_buf is unused (nullptr).
//     limit (swiglu_limit) > 0 is a runtime argument.
// Math (kbpc.reference.glm_swiglu_clamp; FP32, no FMA contraction)
//   ghat = fminf(g, L), uhat = fminf(fmaxf(u, -L), L); y = fl(fl(ghat / fl(1 + expf(-ghat))) * uhat),
//   rounded once to BF16 (RNE) for kBF16, stored as is for kF32. swiglu_clamp_element is the one
//   element expression, for a fused gate/up epilogue to share.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"
#include "kbp_transcendental.cuh"

namespace kbp {

enum class SwiGluOut : int { kBF16 = 0, kF32 = 1 };

__device__ __forceinline__ float swiglu_clamp_element(float g, float u, float limit) {
    const float gh = fminf(g, limit);
    const float uh = fminf(fmaxf(u, -limit), limit);
    return __fdiv_rn(gh, 1.0f + exp_f32(-gh)) * uh;
}

template <int VEC>
struct alignas(2 * VEC) SwiGluBF16Vec { __nv_bfloat16 v[VEC]; };
template <int VEC>
struct alignas(4 * VEC) SwiGluF32Vec { float v[VEC]; };

// Grid-stride zero fill over the whole grid, 16 bytes at a time with a scalar tail.
__device__ __forceinline__ void zero_fill_words(float* buf, size_t words) {
    const size_t nthreads = (size_t)gridDim.x * gridDim.y * blockDim.x;
    const size_t id = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    const size_t quads = words / 4;
    for (size_t i = id; i < quads; i += nthreads) reinterpret_cast<float4*>(buf)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (size_t i = quads * 4 + id; i < words; i += nthreads) buf[i] = 0.0f;
}

template <int INTER, int VEC, SwiGluOut OUT, bool ZERO_FILL>
__device__ __forceinline__ void swiglu_clamp_body(const __nv_bfloat16* gate,
                                                  const __nv_bfloat16* up, long in_stride,
                                                  void* out, long out_stride, float limit,
                                                  float* zero_buf, size_t zero_words) {
    static_assert(INTER % VEC == 0 && (VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8), "VEC");
    if constexpr (ZERO_FILL) zero_fill_words(zero_buf, zero_words);
    const int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= INTER) return;
    const size_t r = blockIdx.y;
    const auto g = *reinterpret_cast<const SwiGluBF16Vec<VEC>*>(gate + r * in_stride + i0);
    const auto u = *reinterpret_cast<const SwiGluBF16Vec<VEC>*>(up + r * in_stride + i0);
    float y[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) y[v] = swiglu_clamp_element(bf16_to_f32(g.v[v]), bf16_to_f32(u.v[v]), limit);
    if constexpr (OUT == SwiGluOut::kBF16) {
        SwiGluBF16Vec<VEC> o;
#pragma unroll
        for (int v = 0; v < VEC; ++v) o.v[v] = f32_to_bf16(y[v]);
        *reinterpret_cast<SwiGluBF16Vec<VEC>*>(static_cast<__nv_bfloat16*>(out) + r * out_stride + i0) = o;
    } else {
        SwiGluF32Vec<VEC> o;
#pragma unroll
        for (int v = 0; v < VEC; ++v) o.v[v] = y[v];
        *reinterpret_cast<SwiGluF32Vec<VEC>*>(static_cast<float*>(out) + r * out_stride + i0) = o;
    }
}

template <int INTER, int VEC, SwiGluOut OUT, bool ZERO_FILL>
__global__ void swiglu_clamp(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                             long in_stride, void* out, long out_stride, float limit,
                             float* zero_buf, size_t zero_words) {
    KBP_STAMP_BEGIN();   // phase stamps of a profiling build (kbp_stamps.cuh): begin, the wait, end
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    swiglu_clamp_body<INTER, VEC, OUT, ZERO_FILL>(gate, up, in_stride, out, out_stride, limit, zero_buf,
                                                  zero_words);
    KBP_STAMP_END();
}

}  // namespace kbp
