// kbp_transcendental.cuh: the FP32 transcendentals the families' numerics name (expf, __expf,
// rsqrtf), as one implementation every kernel uses.
// Launch contract: none (inline device functions only). Self-contained.
// Default: evaluated in double and rounded once to float: the correctly rounded value, which is
// what kbpc.reference.f32ops computes and lies within the error bound of CUDA's expf, __expf and
// rsqrtf alike. So the GPU step matches the reference bit for bit, and an NVFP4/FP8 quantizer
// downstream never flips a code over a last-ulp difference (measured: a 1-ulp rsqrtf difference in
// a site norm moved a whole MoE output by 2-4%). The cost is a few double ops per row or element
// in memory-bound kernels. KBP_FAST_MATH selects CUDA's expf / rsqrtf instead (within 2 ulp).
#pragma once

namespace kbp {

__device__ __forceinline__ float exp_f32(float x) {
#ifndef KBP_FAST_MATH
    return (float)exp((double)x);
#else
    return expf(x);
#endif
}

__device__ __forceinline__ float rsqrt_f32(float x) {
#ifndef KBP_FAST_MATH
    return (float)(1.0 / sqrt((double)x));
#else
    return rsqrtf(x);
#endif
}

// sigma(z) = 1 / (1 + expf(-z)): two correctly rounded ops around expf (a true division).
__device__ __forceinline__ float sigmoid_f32(float z) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f32(-z)));
}

}  // namespace kbp
