// w4a4_mx_static.cuh: W4A4 with a static NVFP4 activation scale gamma (family w4a4_mx_static).
//
// Entries (formats and the product as in w4a4_mx.cuh; 256-thread CTAs):
//   w4a4_quant_rows_static<K>(x, gamma, a_codes, a_scales, a_g)   grid = (m rows, S)
//       w4a4_quant_rows with the global scale fixed to gamma (a_g[r] = gamma is written too, so
//       the GEMVs read one layout). K % 16 == 0. Any S >= 1 CTAs a row, each quantizing every S-th
//       run of 256 values (no max to find: a CTA reads only its own values); S = ceil(K / 256)
//       is one value a thread.
//   w4a4_gemv_moe_slots<K, FAST>(ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, y, N)
//       grid = (N/16, S) for S routed slots (t, r) flattened; block 256. Slot s reads its expert id
//       e = ids[s] from device memory (no host round trip); e == -1 writes +0 to y[s, :].
//       Activation row of slot s: s / act_div (act_div = top_k: one row per token shared by its
//       slots, as the gate/up projection; act_div = 1: one row per slot, as the down projection).
//       Expert weights stacked (E, N, K/2), (E, N, K/16), w_gscale (E,) FP32 in device memory;
//       y (S, N) BF16. N % 16 == 0, K % 128 == 0. Result bytes = w4a4_gemv's for that expert, with
//       scale f32(a_g[row] * s_g[e]) (= gamma * s_g for static activations); FAST: w4a4_gemv's
//       fast form (FP32 accumulation, numerics fast), within gemv_bounds.w4a4_fast_bound of it.
//   w4a4_gemv_moe_slots<K, FAST, TILES>: TILES 16-row tiles a CTA, grid = (N/(16 TILES), S),
//       N % (16 TILES) == 0; the same bytes (more weight bytes in flight per lane for small K).
//       PDL: dependents are released right after the wait (they launch once every CTA has
//       started, so the SwiGLU quantizer after the routed gate/up is resident when the gate/up
//       completes; H200, 128-expert seed shrink, replay timelines: the quantizer ends 3.2 us
//       after the gate/up instead of 5.4, a MoE sublayer 57.6 -> 55.8 us; bench/NOTES.md,
//       twenty-fifth session). Its dependents still read its output only after their own wait.
//   w4a4_gemv_moe_slots_after_quant<K, FAST, TILES>(ids, a_codes, a_scales, a_g, w_codes, w_scales,
//       w_gscale, y, N): the down projection's form (act_div 1) right after
//       w4a4_quant_swiglu_rows_static, its expert id read and its weights loaded before pdl_wait.
//   w4a4_gemv_moe_slots_bf16<K>(ids, act_div, x, gamma, w_codes, w_scales, w_gscale, y, N)
//       w4a4_quant_rows_static fused into w4a4_gemv_moe_slots (same grid): each CTA quantizes its
//       BF16 activation row x[s / act_div] (K values) with gamma straight into shared memory, the
//       same device functions in the same order, so the bytes equal the two-kernel path's.
//   w4a4_quant_swiglu_rows_static<K>(gate_up, limit, gamma, a_codes, a_scales, a_g)
//       grid = (ceil(K / 256), m rows), block 256 (one value a thread)
//       The routed clamped SwiGLU of [gate | up] BF16 rows (2K each), rounded to BF16 as
//       glm_swiglu_clamp stores it, quantized as w4a4_quant_rows_static: the down projection's
//       input rows in one launch (rule moe_swiglu_down).
// Entry points: the __global__ template, or its body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper (what the GPU tests do).
// Phase stamps (kbp_stamps.cuh; w4a4_gemv_moe_slots, _after_quant: the wait, 3 the tiles' dots done;
// w4a4_quant_swiglu_rows_static: the wait, 3 the SwiGLU value formed).
#pragma once

#include "glm_swiglu_clamp.cuh"
#include "w4a4_mx.cuh"

namespace kbp {

// Row blockIdx.x's values i = blockIdx.y * 256 + threadIdx.x (+ gridDim.y * 256 ...), a 16-value
// group over 16 lanes (nvfp4_quant_group_lanes): nvfp4_quant_group's bytes with g = gamma, one value's
// latency a thread instead of 16 values in series (what the fused router's share does too).
template <int K>
__device__ __forceinline__ void w4a4_quant_rows_static_dev(const __nv_bfloat16* x, float gamma,
                                                              uint8_t* a_codes,
                                                              uint8_t* a_scales,
                                                              float* a_g) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    const size_t r = blockIdx.x;
    const float inv_g = __fdiv_rn(1.0f, gamma);
    // K % 16 == 0 and 256 % 16 == 0: the 16 lanes of a group enter and leave the loop together.
    for (int i = blockIdx.y * 256 + threadIdx.x; i < K; i += gridDim.y * 256)
        nvfp4_quant_group_lanes(bf16_to_f32(ld_step(x + r * K + i)), threadIdx.x & 15, gamma, inv_g,
                                a_codes + r * (K / 2) + 8 * (i / 16), a_scales + r * (K / 16) + i / 16);
    if (blockIdx.y == 0 && threadIdx.x == 0) a_g[r] = gamma;
}

template <int K>
__global__ void __launch_bounds__(256) w4a4_quant_rows_static(const __nv_bfloat16* x, float gamma,
                                                              uint8_t* a_codes,
                                                              uint8_t* a_scales,
                                                              float* a_g) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w4a4_quant_rows_static_dev<K>(x, gamma, a_codes, a_scales, a_g);
}

// Tiles first_tile .. first_tile + TILES - 1 (16 rows each) of slot `slot` in a 256-thread CTA (a
// merged grid's tile too, kernels/moe_experts.cuh), the activation row staged once for them; each
// tile's bytes are the same whatever TILES. TILES = 2 gives a lane of the MoE down projection
// (K = 2048) four chunks of weights in flight, as one tile of the gate/up's K = 4096 does (H200,
// 8 slots of 4096 x 2048, fast form alone: 13.85 -> 13.50 us; in the step the down ends ~0.3 us
// sooner: both GEMVs carry ~4 us of ramp and tail beside their byte time, which this leaves).
// IDS_EARLY (w4a4_gemv_moe_slots_after_quant): the caller has not waited yet; the expert id is
// read through L2 and the weights are put in flight before this function's pdl_wait.
template <int K, bool FAST = false, int TILES = 1, bool IDS_EARLY = false>
__device__ __forceinline__ void w4a4_gemv_moe_slot_tile(
    int first_tile, int slot, const int* ids, int act_div, const uint8_t* a_codes,
    const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    static_assert(K % 128 == 0 && TILES >= 1, "w4a4 walks K in 128-wide chunks");
    __shared__ W4A4Smem<K> sm;
    const int e = IDS_EARLY ? __ldcg(ids + slot) : ld_step(ids + slot);
    const size_t n0 = (size_t)first_tile * 16;
    __nv_bfloat16* yo = y + (size_t)slot * N + n0;
    if (e < 0) {  // empty slot: defined zeros (uniform branch for the whole CTA)
        if (IDS_EARLY) ::kbp::pdl_wait();   // y may still be read by an earlier kernel
        if (threadIdx.x < 16 * TILES) yo[threadIdx.x] = f32_to_bf16(0.0f);
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t ew = (size_t)e * N;
    W4A4Rows<K> w[TILES];  // every tile's weights in flight before the activation staging
#pragma unroll
    for (int i = 0; i < TILES; ++i)
        w4a4_load_rows<K>(w[i], w_codes + (ew + n0 + 16 * i) * (K / 2), w_scales + (ew + n0 + 16 * i) * (K / 16),
                          warp, lane);
    const size_t row = (unsigned)slot / (unsigned)act_div;  // slot >= 0, act_div >= 1: the unsigned divide is shorter
    if (IDS_EARLY) {
        KBP_STAMP(kStampWaitIn);
        ::kbp::pdl_wait();   // the activation rows come from the previous kernel
        KBP_STAMP(kStampWaitOut);
        ::kbp::pdl_launch_dependents();   // after the wait, as w4a4_gemv_moe_slots (see the header)
    }
    w4a4_stage_act<K>(a_codes + row * (K / 2), a_scales + row * (K / 16), sm);
    __syncthreads();
    float acc[TILES];
#pragma unroll
    for (int i = 0; i < TILES; ++i) acc[i] = w4a4_rows_dot<K, FAST>(w[i], sm, warp, lane);
    KBP_STAMP(3);   // the tiles' dots done (thread 0's weights consumed), before the finish
    const float scale = __fmul_rn(ld_step(a_g + row), __ldg(w_gscale + e));
#pragma unroll
    for (int i = 0; i < TILES; ++i) {
        if (i) __syncthreads();   // the previous tile's partials are read before they are overwritten
        w4a4_finish(acc[i], sm.part, scale, yo + 16 * i, warp, lane);
    }
}

template <int K, bool FAST = false, int TILES = 1>
__device__ __forceinline__ void w4a4_gemv_moe_slots_dev(
    const int* ids, int act_div, const uint8_t* a_codes,
    const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    w4a4_gemv_moe_slot_tile<K, FAST, TILES>(blockIdx.x * TILES, blockIdx.y, ids, act_div, a_codes, a_scales, a_g,
                                            w_codes, w_scales, w_gscale, y, N);
}

template <int K, bool FAST = false, int TILES = 1, int MIN_CTAS = w4a4_min_ctas<K>()>   // (w4a4_mx.cuh)
__global__ void __launch_bounds__(256, MIN_CTAS) w4a4_gemv_moe_slots(
    const int* ids, int act_div, const uint8_t* a_codes,
    const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    ::kbp::pdl_launch_dependents();   // once every CTA has started: see the header
    w4a4_gemv_moe_slots_dev<K, FAST, TILES>(ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, y, N);
    KBP_STAMP_END();
}

// w4a4_gemv_moe_slots right after a launch that triggers its dependents only once its own
// pdl_wait has returned (w4a4_quant_swiglu_rows_static, rule moe_swiglu_down): when this grid
// runs, every kernel before that launch has completed, the router that wrote the expert ids
// among them, so a CTA reads its id (through L2: an L1 line may predate the router's store) and
// puts its weights in flight before its own pdl_wait, which then covers only the quantizer's
// activation rows. The same bytes as w4a4_gemv_moe_slots.
template <int K, bool FAST = false, int TILES = 1, int MIN_CTAS = w4a4_min_ctas<K>()>
__global__ void __launch_bounds__(256, MIN_CTAS) w4a4_gemv_moe_slots_after_quant(
    const int* ids, const uint8_t* a_codes,
    const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    KBP_STAMP_BEGIN();
    w4a4_gemv_moe_slot_tile<K, FAST, TILES, true>(blockIdx.x * TILES, blockIdx.y, ids, 1, a_codes, a_scales, a_g,
                                                  w_codes, w_scales, w_gscale, y, N);
    KBP_STAMP_END();
}

// Stage a BF16 row quantized with the static global scale gamma, as w4a4_stage_act stages the
// codes/scales that w4a4_quant_rows_static would have written.
template <int K>
__device__ __forceinline__ void w4a4_stage_act_static(const __nv_bfloat16* x, float gamma, W4A4Smem<K>& sm) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    static_assert(K <= W4A4_MAX_K, "the activation staging must fit static shared memory");
    const float inv_g = __fdiv_rn(1.0f, gamma);
    for (int j = threadIdx.x; j < K / 16; j += 256) {
        float v[16];
        bf16x16_load(x + 16 * j, v);
        __align__(8) uint8_t codes[8];
        uint8_t sc;
        nvfp4_quant_group(v, gamma, inv_g, codes, &sc);
        w4a4_stage_group(sm, j, *reinterpret_cast<const uint2*>(codes), sc);
    }
}

template <int K>
__device__ __forceinline__ void w4a4_gemv_moe_slots_bf16_dev(
    const int* ids, int act_div, const __nv_bfloat16* x, float gamma,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    static_assert(K % 128 == 0, "w4a4 walks K in 128-wide chunks");
    __shared__ W4A4Smem<K> sm;
    const int slot = blockIdx.y, e = ld_step(ids + slot);
    const size_t n0 = (size_t)blockIdx.x * 16;
    __nv_bfloat16* yo = y + (size_t)slot * N + n0;
    if (e < 0) {  // empty slot: defined zeros (uniform branch for the whole CTA)
        if (threadIdx.x < 16) yo[threadIdx.x] = f32_to_bf16(0.0f);
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t ew = (size_t)e * N;
    W4A4Rows<K> w;  // the expert's weights in flight before the activation staging
    w4a4_load_rows<K>(w, w_codes + (ew + n0) * (K / 2), w_scales + (ew + n0) * (K / 16), warp, lane);
    const size_t row = (unsigned)slot / (unsigned)act_div;
    w4a4_stage_act_static<K>(x + row * K, gamma, sm);
    __syncthreads();
    const float acc = w4a4_rows_dot<K>(w, sm, warp, lane);
    w4a4_finish(acc, sm.part, __fmul_rn(gamma, __ldg(w_gscale + e)), yo, warp, lane);
}

template <int K>
__global__ void __launch_bounds__(256, 2) w4a4_gemv_moe_slots_bf16(
    const int* ids, int act_div, const __nv_bfloat16* x, float gamma,
    const uint8_t* w_codes, const uint8_t* w_scales,
    const float* w_gscale, __nv_bfloat16* y, int N) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w4a4_gemv_moe_slots_bf16_dev<K>(ids, act_div, x, gamma, w_codes, w_scales, w_gscale, y, N);
}

// ------------------------------------------------------------------ the down projection's input

// Group j (16 values) of the clamped SwiGLU of a [gate (K) | up (K)] BF16 row, each value rounded
// to BF16 as glm_swiglu_clamp stores it, quantized with the static scale gamma (1/gamma = inv_g).
template <int K, bool L2_ONLY = false>
__device__ __forceinline__ void swiglu_quant_group(const __nv_bfloat16* gate_up, int j, float limit, float gamma,
                                                   float inv_g, uint8_t* codes, uint8_t* scale) {
    float v[16], u[16];
    bf16x16_load<L2_ONLY>(gate_up + 16 * j, v);
    bf16x16_load<L2_ONLY>(gate_up + K + 16 * j, u);
#pragma unroll
    for (int i = 0; i < 16; ++i) v[i] = round_bf16(swiglu_clamp_element(v[i], u[i], limit));
    nvfp4_quant_group(v, gamma, inv_g, codes, scale);
}

// The down projection's input rows, quantized once per slot: row r = blockIdx.y's clamped SwiGLU
// of gate_up[r] (2K BF16), each value rounded to BF16 as glm_swiglu_clamp stores it, NVFP4 with
// gamma, as w4a4_quant_rows_static would write it from the stored SwiGLU row (a_g[r] = gamma).
// grid = (ceil(K / 256), rows), block 256: one value a thread (nvfp4_quant_group_lanes), so the
// latency is one SwiGLU and one group's shuffles, not sixteen values' chain in one thread.
template <int K>
__global__ void __launch_bounds__(256) w4a4_quant_swiglu_rows_static(const __nv_bfloat16* gate_up,
                                                                      float limit, float gamma,
                                                                      uint8_t* a_codes,
                                                                      uint8_t* a_scales,
                                                                      float* a_g) {
    static_assert(K % 16 == 0, "NVFP4 groups are 16 values");
    KBP_STAMP_BEGIN();
    const float inv_g = __fdiv_rn(1.0f, gamma);
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: the gate/up rows come from the previous kernel
    KBP_STAMP(kStampWaitOut);
    // Dependents only after the wait (their CTAs still become resident before this launch's
    // work): w4a4_gemv_moe_slots_after_quant reads the router's ids before its own wait.
    ::kbp::pdl_launch_dependents();
    const size_t r = blockIdx.y;
    const int i = blockIdx.x * 256 + threadIdx.x;  // K % 16 == 0: a group is all in or all out
    if (i >= K) {                                   // whole 16-lane groups leave together
        KBP_STAMP_END();
        return;
    }
    const __nv_bfloat16* row = gate_up + r * (2 * (size_t)K);
    const float v = round_bf16(swiglu_clamp_element(bf16_to_f32(ld_step(row + i)),
                                                    bf16_to_f32(ld_step(row + K + i)), limit));
    KBP_STAMP(3);   // the gate/up pair loaded and the SwiGLU value formed (before the group's quantization)
    const int j = i / 16;
    nvfp4_quant_group_lanes(v, threadIdx.x & 15, gamma, inv_g, a_codes + r * (K / 2) + 8 * j, a_scales + r * (K / 16) + j);
    if (i == 0) a_g[r] = gamma;
    KBP_STAMP_END();
}

// The routed gate/up slot GEMV with the down projection's input in its epilogue (rule
// moe_gate_up_swiglu): w4a4_gemv_moe_slots<K> into the [gate | up] rows gu (S, 2I) BF16, then the
// last CTA of each slot to finish (counters[slot], zero at launch, left zero) reads the slot's row
// back through L2 and writes its clamped SwiGLU, rounded to BF16 and quantized with gamma, as
// w4a4_quant_swiglu_rows_static<I> does (the same device functions: the same bytes). Empty slots
// (id -1) arrive too: their row is +0, as in the unfused chain. grid = (2I/16, S), block 256.
template <int K, int I>
__device__ __forceinline__ void w4a4_gemv_moe_gate_up_swiglu_dev(
    const int* ids, int act_div, const uint8_t* a_codes, const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales, const float* w_gscale, __nv_bfloat16* gu,
    float limit, float gamma, uint8_t* h_codes, uint8_t* h_scales, float* h_g, unsigned* counters) {
    static_assert(I % 16 == 0, "NVFP4 groups are 16 values");
    w4a4_gemv_moe_slots_dev<K>(ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, gu, 2 * I);
    const size_t slot = blockIdx.y;
    if (!last_to_arrive(counters + slot, gridDim.x)) return;
    const float inv_g = __fdiv_rn(1.0f, gamma);
    for (int j = threadIdx.x; j < I / 16; j += 256)
        swiglu_quant_group<I, true>(gu + slot * (2 * (size_t)I), j, limit, gamma, inv_g, h_codes + slot * (I / 2) + 8 * j,
                                    h_scales + slot * (I / 16) + j);
    if (threadIdx.x == 0) h_g[slot] = gamma;
}

template <int K, int I, int MIN_CTAS = w4a4_min_ctas<K>()>
__global__ void __launch_bounds__(256, MIN_CTAS) w4a4_gemv_moe_gate_up_swiglu(
    const int* ids, int act_div, const uint8_t* a_codes, const uint8_t* a_scales, const float* a_g,
    const uint8_t* w_codes, const uint8_t* w_scales, const float* w_gscale, __nv_bfloat16* gu,
    float limit, float gamma, uint8_t* h_codes, uint8_t* h_scales, float* h_g, unsigned* counters) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    w4a4_gemv_moe_gate_up_swiglu_dev<K, I>(ids, act_div, a_codes, a_scales, a_g, w_codes, w_scales, w_gscale, gu,
                                           limit, gamma, h_codes, h_scales, h_g, counters);
}

}  // namespace kbp
