// kbp_common.cuh: device helpers shared by every kernel family header.
// Launch contract: none (inline device functions only). Self-contained: includes what it uses.
// Numerics: every conversion here is the one the blueprint's `explain.formats` defines:
//   BF16  round-to-nearest-even of the FP32 value (cuda_bf16's __float2bfloat16_rn);
//   E4M3  finite-only, saturating at +-448, round-to-nearest-even (cuda_fp8's __NV_SATFINITE);
//   E2M1  round-to-nearest-even onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6.
// Kernels are built with --fmad=false so that a*b+c stays two correctly rounded operations,
// matching the numpy reference; where a family's math asks for an FMA, it calls __fmaf_rn.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "kbp_stamps.cuh"
#include "kbp_transcendental.cuh"

namespace kbp {

// Programmatic dependent launch (PDL). Every kernel of a step may be launched with the
// programmatic-stream-serialization attribute, so it can start while the kernel before it on the
// stream is still running. Contract for every kernel: call pdl_wait() before the first read of
// anything an earlier kernel wrote and before the first global write (work that depends on
// nothing earlier, such as prefetching weights into L2 or registers, goes before it); call
// pdl_launch_dependents() once the rest of the kernel no longer needs the SMs to itself (or not at
// all: dependents then launch as the kernel's CTAs exit). The latency-bound kernels (norms,
// quantizers, KDA conv / recurrence / gated norm, attention, router glue) call it first thing: the
// dependent's CTAs take free SMs while they run and wait in pdl_wait, which returns only once this
// grid has completed and its writes are visible, so an early trigger changes when kernels start,
// never what they read (measured on an H200, 128-expert seed shrink at 1k: 6.94-6.98 -> 6.71-6.75 ms
// a step, logits bit-equal; scripts/compare_logits.py). The condition is that every CTA of the
// grid has triggered or exited, so a dependent never takes the place of a CTA of this grid.
// Both are no-ops when the kernel was launched without the attribute, and compile to nothing
// before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Prefetch the 128-byte lines of [p, p + bytes) into L2, one line per thread-stride step
// (weights a kernel will stream, issued before pdl_wait()).
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes, int tid, int nthreads) {
    const char* c = static_cast<const char*>(p);
    for (size_t off = (size_t)tid * 128; off < bytes; off += (size_t)nthreads * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
}

// Streamed weight loads (each byte read once a step): evict-first as __ldcs, and each miss asks L2
// for the whole 128-byte line from DRAM instead of the 32-byte sectors the load touches (a lane
// reads 2-32 bytes of a row; the rest of the line is read by its neighbours next). H200, 128-expert
// seed shrink, fast: the step ~1.1% faster than with __ldcs; asking for 256 bytes gained ~0.5%
// (bench/NOTES.md, twenty-fourth session).
__device__ __forceinline__ uint4 ld_weight(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cs.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ uint2 ld_weight(const uint2* p) {
    uint2 v;
    asm volatile("ld.global.cs.L2::128B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}
__device__ __forceinline__ uint32_t ld_weight(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.global.cs.L2::128B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint16_t ld_weight(const uint16_t* p) {
    uint16_t v;
    asm volatile("ld.global.cs.L2::128B.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ uint8_t ld_weight(const uint8_t* p) {
    uint16_t v;
    asm volatile("ld.global.cs.L2::128B.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return (uint8_t)v;
}

// GPU-scope 32-bit accesses of cross-CTA hand-offs (flags, counters, self-flagging words): a relaxed
// access is single-copy atomic and goes to L2; acquire / release order the accesses around them.
__device__ __forceinline__ unsigned ld_relaxed_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_relaxed_gpu(unsigned* p, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Whether this CTA is the last of `total` to arrive at `counter` (zero at launch, left zero). Call
// from every thread after the CTA's global writes: the CTA barrier orders them before thread 0's
// fence (cumulative) and atomic add, so the last CTA, after its own fence (acquire), sees every
// other CTA's writes; it should read them through L2 (__ldcg), not L1. No CTA waits for another.
// (An acq_rel atomic at GPU scope without the fences measured the same on an H200.)
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, unsigned total) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const bool l = atomicAdd(counter, 1u) == total - 1;
        if (l) {
            *counter = 0u;     // every CTA has arrived: the next launch starts from zero
            __threadfence();
        }
        last = l;
    }
    __syncthreads();
    return last != 0;
}

// Loads of step data: anything an earlier kernel of the step wrote (activations, routing ids and
// weights, scales of quantized rows). Under PDL a kernel starts while the kernels before it still
// run, so its lifetime overlaps their writes, and the non-coherent read-only path (ld.global.nc:
// __ldg, and what the compiler makes of loads through const __restrict__ pointers) may serve a
// line cached before those writes: measured on an H200 (128-expert seed shrink), the routed expert
// GEMVs read their expert ids with __ldg and saw the KDA decay gates an earlier kernel had left at
// the same arena bytes, in 13 to 32 of 42 MoE layers (none without PDL). So kernels take no
// __restrict__ pointers, weights (constant for the whole step) keep __ldg, and step data is read
// after pdl_wait() with coherent loads (ld.global.ca: L1-cached, made current by the wait's acquire).
// tests/gpu/test_gpu_pdl_equality.py holds a PDL build of the seed shrink to the same bits as one
// without PDL.
template <class T>
__device__ __forceinline__ T ld_step(const T* p) { return __ldca(p); }

__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// E4M3 code (uint8) <-> float. The encoder saturates to +-448 and rounds to nearest even; NaN
// cannot arise from finite inputs, which is all the blueprint's quantizers feed it.
__device__ __forceinline__ uint8_t f32_to_e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float e4m3_to_f32(uint8_t code) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)code, __NV_E4M3);
    return __half2float(__half(h));
}

// E2M1 value of a 4-bit code (bit 3 = sign, bits 2..0 = magnitude index).
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float m = mag[code & 7u];
    return (code & 8u) ? -m : m;
}

// Round to nearest even onto the E2M1 grid, saturating at 6. Midpoints between grid values go to
// the neighbour with an even mantissa bit (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4).
__device__ __forceinline__ uint32_t f32_to_e2m1(float v) {
    uint32_t sign = (v < 0.0f || (v == 0.0f && signbit(v))) ? 8u : 0u;
    float a = fabsf(v);
    uint32_t m;
    if (a <= 0.25f) m = 0;
    else if (a < 0.75f) m = 1;
    else if (a <= 1.25f) m = 2;
    else if (a < 1.75f) m = 3;
    else if (a <= 2.5f) m = 4;
    else if (a < 3.5f) m = 5;
    else if (a <= 5.0f) m = 6;
    else m = 7;
    return sign | m;
}

// Asynchronous global -> shared copies (cp.async, sm_80+): 16 bytes bypassing L1 (cg) or 8 bytes
// through it (ca), in commit groups a thread waits for with cp_async_wait<N> (N groups may stay in
// flight) or cp_async_wait_all.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// A cluster barrier that only keeps shared memory alive for the other CTAs' distributed
// shared-memory reads, whose values were consumed before it: no memory ordering (a release would
// wait for every pending store). Not .aligned: the threads of a warp need not be converged here.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait;" ::: "memory"); }
// A cluster barrier split in its halves, publishing shared memory: stores before the arrive are
// visible to every CTA of the cluster after its wait. A release waits for every store this thread
// issued before it, global ones too, so work whose stores nobody in the cluster reads is best put
// between the halves.
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }

// Butterfly (xor) warp sum: offsets 16, 8, 4, 2, 1. Every lane ends with the same value.
__device__ __forceinline__ float warp_sum_xor(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Shuffle-down warp sum: offsets 16, 8, 4, 2, 1; lane 0 holds the total.
__device__ __forceinline__ float warp_sum_down(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max_xor(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// f32(acc + s) correctly rounded, s an exact FP64 value: the FP64 sum made round-to-odd (TwoSum's
// error sets its last bit when it is inexact), then one rounding to float, which is then correct
// (53 >= 24 + 2). kbpc.reference.gemv_order.add_f32, bit for bit; an infinite sum stays infinite.
__device__ __forceinline__ float add_f32_exact(float acc, double s) {
    const double a = (double)acc, t = __dadd_rn(a, s), bv = __dsub_rn(t, a);
    const double err = __dadd_rn(__dsub_rn(a, __dsub_rn(t, bv)), __dsub_rn(s, bv));
    long long bits = __double_as_longlong(t);
    if (err != 0.0 && (bits & 1) == 0 && isfinite(t)) bits += (err > 0.0) == (t > 0.0) ? 1 : -1;
    return __double2float_rn(__longlong_as_double(bits));
}

}  // namespace kbp
