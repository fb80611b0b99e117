// kbp_transcendental.cuh: the FP32 transcendentals the families' numerics name (expf, rsqrtf),
// with a switch for tests.
// Launch contract: none (inline device functions only). Self-contained.
// Default: CUDA's expf (not the __expf intrinsic) and rsqrtf, as the explain text says; each is
// within 2 ulp of the correctly rounded value that kbpc.reference.f32ops computes.
// With KBP_CORRECTLY_ROUNDED_MATH defined (a test build only): both are evaluated in double and
// rounded once to float, as the numpy reference does, so a GPU test can check every other rounding
// point and summation order bit for bit (rsqrt then matches exactly; exp differs only where the
// double results straddle a float rounding boundary, about 1 in 2^28 evaluations).
#pragma once

namespace kbp {

__device__ __forceinline__ float exp_f32(float x) {
#ifdef KBP_CORRECTLY_ROUNDED_MATH
    return (float)exp((double)x);
#else
    return expf(x);
#endif
}

__device__ __forceinline__ float rsqrt_f32(float x) {
#ifdef KBP_CORRECTLY_ROUNDED_MATH
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
