// kda_pack.cuh: KDA q|k|v pack (explain.families.kda_pack).
//
// Launch contract
//   kbp::kda_pack_qkv_bf16<NQ, NK, NV, THREADS>(q, k, v, q_stride, k_stride, v_stride, out, out_stride)
//     q: (rows, >= NQ) BF16, k: (rows, >= NK) BF16, v: (rows, >= NV) BF16, row strides in elements.
//     out: (rows, >= NQ + NK + NV) BF16, row stride out_stride (elements).
//     grid  = (kda_pack_blocks<NQ, NK, NV, THREADS>(), rows), block = (THREADS), no shared memory.
//     Every pointer and stride must allow the vector width kda_pack_vec<NQ, NK, NV>() (in BF16
//     elements: 8 -> 16-byte aligned rows, 2 -> 4-byte, 1 -> 2-byte).
// Math
//   p[t, j] = q[t, j], p[t, NQ + j] = k[t, j], p[t, NQ + NK + j] = v[t, j]: a bit-exact copy.
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper, which must carry the same __launch_bounds__.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>
#include "kbp_common.cuh"

namespace kbp {

// Widest copy unit (in BF16 elements) that divides all three segment widths.
template <int NQ, int NK, int NV>
__host__ __device__ constexpr int kda_pack_vec() {
    return (NQ % 8 == 0 && NK % 8 == 0 && NV % 8 == 0) ? 8
         : (NQ % 2 == 0 && NK % 2 == 0 && NV % 2 == 0) ? 2 : 1;
}

template <int NQ, int NK, int NV, int THREADS>
__host__ __device__ constexpr int kda_pack_blocks() {
    return ((NQ + NK + NV) / kda_pack_vec<NQ, NK, NV>() + THREADS - 1) / THREADS;
}

template <int VEC> struct PackUnit;
template <> struct PackUnit<8> { using type = uint4; };
template <> struct PackUnit<2> { using type = uint32_t; };
template <> struct PackUnit<1> { using type = uint16_t; };

// One thread per copy unit of VEC channels; one grid row per token.
template <int NQ, int NK, int NV, int THREADS>
__device__ __forceinline__ void
kda_pack_qkv_bf16_dev(const __nv_bfloat16* q, const __nv_bfloat16* k,
                      const __nv_bfloat16* v, int q_stride, int k_stride, int v_stride,
                      __nv_bfloat16* out, int out_stride) {
    static_assert(NQ > 0 && NK > 0 && NV > 0, "segment widths must be positive");
    constexpr int VEC = kda_pack_vec<NQ, NK, NV>();
    using U = typename PackUnit<VEC>::type;
    const int unit = blockIdx.x * THREADS + threadIdx.x;
    const int c = unit * VEC;  // first output channel of this unit
    if (c >= NQ + NK + NV) return;
    const long row = blockIdx.y;
    const __nv_bfloat16* src;
    if (c < NQ) src = q + row * q_stride + c;
    else if (c < NQ + NK) src = k + row * k_stride + (c - NQ);
    else src = v + row * v_stride + (c - NQ - NK);
    *reinterpret_cast<U*>(out + row * out_stride + c) = *reinterpret_cast<const U*>(src);
}

template <int NQ, int NK, int NV, int THREADS>
__global__ void __launch_bounds__(THREADS)
kda_pack_qkv_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k,
                  const __nv_bfloat16* v, int q_stride, int k_stride, int v_stride,
                  __nv_bfloat16* out, int out_stride) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    kda_pack_qkv_bf16_dev<NQ, NK, NV, THREADS>(q, k, v, q_stride, k_stride, v_stride, out,
        out_stride);
}

}  // namespace kbp
