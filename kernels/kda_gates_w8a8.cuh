// kda_gates_w8a8.cuh: the KDA decode gate chain in one launch (explain.families.kda_gates_w8a8):
// f = W_f x_f and o_g = W_g x_g as W8A8 E4M3 GEMVs over 1..8 token rows, each with its per-row
// activation quantization, the bounded-sigmoid decay epilogue on f, and the beta sigmoid.
//
// Launch contract
//   kbp::kda_gates_w8a8_k128_rows<N, K, DK, WARPS>(xf, xg, x_stride, m, wf, swf, wg, swg, a_log,
//       dt_bias, lower_bound, b, b_stride, decay, decay_stride, og, og_stride, beta, beta_stride,
//       f_out, f_stride)
//     xf, xg:  (m, K) BF16 token rows (the low-rank f_a and g_a outputs), row stride x_stride
//              (elements, a multiple of 8); 1 <= m <= 8.
//     wf, wg:  (N, K) E4M3 codes, row-major, 16-byte aligned; swf, swg: (N) FP32 row scales.
//     a_log:   (N / DK) FP32 per-head log rate A;  dt_bias: (N) FP32 per-channel bias delta.
//     lower_bound: lambda < 0.   b: (m, H = N / DK) BF16 beta logits, row stride b_stride.
//     decay:   (m, N) FP32 log decay g;  og: (m, N) BF16 output gate;  beta: (m, H) FP32.
//     f_out:   (m, N) BF16 f, or nullptr (f is normally consumed in the epilogue only).
//     grid = (2 * kda_gates_blocks<N, WARPS>()): the first half computes f (+ decay), the second
//     half o_g; block 0 also writes beta (last). block = (32 * WARPS); no shared memory.
//     Weights, scales, a_log and dt_bias are read before pdl_wait; x and b after it.
//     N % 16 == 0, K % 128 == 0, N % DK == 0.
// Math
//   s_a = max(max_k |x_k| / 448, 1e-12) per row (exact max), x_hat = sat_e4m3(clamp(x / s_a, +-448)).
//   acc_n = sum_k W_hat[n,k] x_hat[k]: E4M3 x E4M3 products (exact in FP32) summed by the tensor
//           core per 128-wide chunk (mma.sync m16n8k32 e4m3, four chained from zero; the order
//           inside the tensor core is the hardware's, hence the GPU test's tolerance), chunk sums
//           folded in FP32 in the wxay rowscale order (K = 128: the one chunk sum).
//   f_n = rn_bf16(acc_n * (s_w[n] * s_a));  o_g likewise from x_g, W_g.
//   decay_n = lambda * sigmoid(expf(A[n / DK]) * (f_n + delta_n)), sigmoid(z) = 1 / (1 + expf(-z))
//   beta_h = 1 / (1 + __expf(-b_h))
// Fragment mapping: the K axis is permuted identically for A (weights) and B (tokens), which leaves
// the dot product unchanged: in chunk c, MMA j, lane (g = lane/4, t = lane%4) feeds logical k
// 4t..4t+3 from bytes c*128 + 32t + 8j + 0..3 and logical k 16+4t.. from bytes +4..7. So each lane
// reads 32 contiguous bytes of weight rows n0+g and n0+g+8 and the 32 values of token g at the same
// offset: 16-byte loads, no shared memory.
// Entry points: the __global__ template, or the body kda_gates_w8a8_k128_rows_dev<...>(same
// arguments, then the block index) for a kernel of its own (kernels/kda_conv_gates.cuh), which
// must carry the same __launch_bounds__.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"

namespace kbp {

template <int N, int WARPS>
__host__ __device__ constexpr int kda_gates_blocks() { return (N / 16 + WARPS - 1) / WARPS; }

__device__ __forceinline__ void mma_e4m3_16x8x32(float (&d)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
    return (uint32_t)f32_to_e4m3(a) | ((uint32_t)f32_to_e4m3(b) << 8) |
           ((uint32_t)f32_to_e4m3(c) << 16) | ((uint32_t)f32_to_e4m3(d) << 24);
}

// s_a from a token row's exact max |x|.
__device__ __forceinline__ float token_scale_of_max(float amax) { return fmaxf(amax / 448.0f, 1e-12f); }

// E4M3 codes of 4 values v / s_a (clamped to +-448), packed lowest k in the low byte.
__device__ __forceinline__ uint32_t quantize4(const float* v, float sa) {
    float q[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = fminf(fmaxf(v[e] / sa, -448.0f), 448.0f);
    return e4m3x4(q[0], q[1], q[2], q[3]);
}

// One lane's weight bytes of a 16-row tile: rows n0+g (lo) and n0+g+8 (hi), 32 bytes per chunk.
template <int K>
struct GatesTile {
    uint4 lo[K / 128][2], hi[K / 128][2];
};

template <int K>
__device__ __forceinline__ void gates_tile_load(const uint8_t* w, int n0, int g, int t,
                                                GatesTile<K>& tile) {
    const uint4* lo = reinterpret_cast<const uint4*>(w + (long)(n0 + g) * K + 32 * t);
    const uint4* hi = reinterpret_cast<const uint4*>(w + (long)(n0 + g + 8) * K + 32 * t);
#pragma unroll
    for (int c = 0; c < K / 128; ++c) {
        tile.lo[c][0] = lo[c * 8]; tile.lo[c][1] = lo[c * 8 + 1];
        tile.hi[c][0] = hi[c * 8]; tile.hi[c][1] = hi[c * 8 + 1];
    }
}

// acc[0..1]: row n0+g, tokens 2t, 2t+1; acc[2..3]: row n0+g+8, same tokens. Each 128-wide chunk
// is one tensor-core sum (four chained MMAs from zero); chunks fold like the wxay rowscale order:
// partial w (of 8) adds chunks w, w+8, ... in FP32 from +0, then the partials add in order.
template <int K>
__device__ __forceinline__ void gates_tile_mma(const GatesTile<K>& tile, const uint32_t (&xq)[K / 128][8],
                                               float (&acc)[4]) {
    constexpr int KC = K / 128, PARTS = KC < 8 ? KC : 8;
    float part[PARTS][4];
#pragma unroll
    for (int c = 0; c < KC; ++c) {
        const uint4 l0 = tile.lo[c][0], l1 = tile.lo[c][1], h0 = tile.hi[c][0], h1 = tile.hi[c][1];
        const uint32_t L[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        const uint32_t Hh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        float cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t a[4] = {L[2 * j], Hh[2 * j], L[2 * j + 1], Hh[2 * j + 1]};
            mma_e4m3_16x8x32(cs, a, xq[c][2 * j], xq[c][2 * j + 1]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) part[c % 8][e] = (c < 8 ? 0.0f : part[c % 8][e]) + cs[e];
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        acc[e] = part[0][e];
#pragma unroll
        for (int p = 1; p < PARTS; ++p) acc[e] = acc[e] + part[p][e];
    }
}

// The epilogue values, in FP32 op by op (one home for the fused KDA kernel too):
// f = rn_bf16(acc * (s_w * s_a));  decay = lambda * sigmoid(expf(A) * (f + delta));  beta = sigmoid(b).
__device__ __forceinline__ float gates_row_value(float acc, float sw, float sa) {
    return round_bf16(acc * (sw * sa));
}
__device__ __forceinline__ float kda_decay_gate_exp_a(float f, float exp_a, float dt_bias, float lower_bound) {
    const float z = exp_a * (f + dt_bias);
    return lower_bound * (1.0f / (1.0f + kbp::exp_f32(-z)));
}
__device__ __forceinline__ float kda_decay_gate(float f, float a_log, float dt_bias, float lower_bound) {
    return kda_decay_gate_exp_a(f, kbp::exp_f32(a_log), dt_bias, lower_bound);
}
__device__ __forceinline__ float kda_beta_gate(float b) { return 1.0f / (1.0f + kbp::exp_f32(-b)); }

// One token row by the whole warp: lane L holds values c*128 + 4L .. +3 of every chunk c
// (load_row_warp, apart so that a caller can issue the loads with its others); row_words_warp forms
// s_a from the warp's exact max (every lane returns it) and lane L's E4M3 code word of each chunk.
// The same scale and per-value expression as kbpc.reference.kda_gates_w8a8, so the same codes; a
// lane then collects the words 8t .. 8t+7 of each chunk of its token with shuffles. Four divisions
// a lane, where one lane quantizing 32 values of a chunk alone made 32.
template <int K>
__device__ __forceinline__ void load_row_warp(const __nv_bfloat16* x, int lane, uint2 (&raw)[K / 128]) {
#pragma unroll
    for (int c = 0; c < K / 128; ++c) raw[c] = ld_step(reinterpret_cast<const uint2*>(x + c * 128 + 4 * lane));
}
template <int K>
__device__ __forceinline__ float row_words_warp(const uint2 (&raw)[K / 128], uint32_t (&word)[K / 128]) {
    constexpr int KC = K / 128;
    float v[KC][4], amax = 0.0f;
#pragma unroll
    for (int c = 0; c < KC; ++c) {
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[c].x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw[c].y));
        v[c][0] = a.x; v[c][1] = a.y; v[c][2] = b.x; v[c][3] = b.y;
#pragma unroll
        for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(v[c][e]));
    }
    const float sa = token_scale_of_max(warp_max_xor(amax));
#pragma unroll
    for (int c = 0; c < KC; ++c) word[c] = quantize4(v[c], sa);
    return sa;
}

// One token's codes as the MMA's column 0: lane (0, t) gets the words 8t .. 8t+7 of each chunk,
// lanes of g > 0 zeros (the columns of absent tokens). Returns s_a.
template <int K>
__device__ __forceinline__ float quantize_row_warp(const uint2 (&raw)[K / 128], int g, int t,
                                                   uint32_t (&xq)[K / 128][8]) {
    uint32_t word[K / 128];
    const float sa = row_words_warp<K>(raw, word);
#pragma unroll
    for (int c = 0; c < K / 128; ++c)
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t got = __shfl_sync(0xffffffffu, word[c], 8 * t + w);
            xq[c][w] = g == 0 ? got : 0u;
        }
    return sa;
}

// Per-token quantization of m <= 8 rows by the whole warp (the launch's latency path): every
// row's loads in flight at once, then row_words_warp per row; lane (g, t) ends with token g's
// words, rows g >= m stay zero. sa[r] is token r's scale (every lane holds all m of them).
template <int K>
__device__ __forceinline__ void quantize_rows_warp(const __nv_bfloat16* x, int x_stride, int m, int g,
                                                   int t, int lane, uint32_t (&xq)[K / 128][8],
                                                   float (&sa)[8]) {
    constexpr int KC = K / 128;
#pragma unroll
    for (int c = 0; c < KC; ++c)
#pragma unroll
        for (int w = 0; w < 8; ++w) xq[c][w] = 0u;
    uint2 raw[8][KC];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < KC; ++c)
            raw[r][c] = r < m ? ld_step(reinterpret_cast<const uint2*>(x + (long)r * x_stride + c * 128 + 4 * lane))
                              : make_uint2(0u, 0u);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        sa[r] = 1.0f;
        if (r >= m) continue;  // warp-uniform
        uint32_t word[KC];
        sa[r] = row_words_warp<K>(raw[r], word);
#pragma unroll
        for (int c = 0; c < KC; ++c)
#pragma unroll
            for (int w = 0; w < 8; ++w) {
                const uint32_t got = __shfl_sync(0xffffffffu, word[c], 8 * t + w);
                if (g == r) xq[c][w] = got;
            }
    }
}

// Everything that does not depend on the step's data is loaded before pdl_wait (the weight tile,
// the row scales, the per-channel epilogue constants and e^A): the epilogue's loads would otherwise
// sit between its stores, each a dependent round trip to memory.
template <int N, int K, int DK, int WARPS>
__device__ __forceinline__ void
kda_gates_w8a8_k128_rows_dev(const __nv_bfloat16* xf, const __nv_bfloat16* xg,
                             int x_stride, int m,
                             const uint8_t* wf, const float* swf,
                             const uint8_t* wg, const float* swg,
                             const float* a_log, const float* dt_bias,
                             float lower_bound, const __nv_bfloat16* b, int b_stride,
                             float* decay, int decay_stride,
                             __nv_bfloat16* og, int og_stride,
                             float* beta, int beta_stride,
                             __nv_bfloat16* f_out, int f_stride, int block) {
    static_assert(N % 16 == 0 && K % 128 == 0 && N % DK == 0, "16-row tiles, 128-wide K chunks");
    constexpr int BLOCKS = kda_gates_blocks<N, WARPS>();
    constexpr int H = N / DK;
    const bool seg_f = block < BLOCKS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n0 = ((seg_f ? block : block - BLOCKS) * WARPS + warp) * 16;
    const int g = lane / 4, t = lane % 4;
    const bool rows = n0 < N;  // warp-uniform

    GatesTile<K> tile;
    float sw[2], exp_a[2], bias[2];
    if (rows) {
        gates_tile_load<K>(seg_f ? wf : wg, n0, g, t, tile);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int n = n0 + g + 8 * h;
            sw[h] = __ldg((seg_f ? swf : swg) + n);
            exp_a[h] = seg_f ? kbp::exp_f32(__ldg(a_log + n / DK)) : 0.0f;
            bias[h] = seg_f ? __ldg(dt_bias + n) : 0.0f;
        }
    }
    KBP_STAMP(kStampWaitIn);   // phase stamps of a kernel that began them (kbp_stamps.cuh)
    pdl_wait();   // PDL: nothing below reads step data before the previous kernel completes
    KBP_STAMP(kStampWaitOut);

    if (rows) {
        uint32_t xq[K / 128][8];
        float sa[8];
        quantize_rows_warp<K>(seg_f ? xf : xg, x_stride, m, g, t, lane, xq, sa);
        float acc[4];
        gates_tile_mma<K>(tile, xq, acc);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int tok = 2 * t + (e & 1), h = e >> 1;
            const int n = n0 + g + 8 * h;
            if (tok >= m) continue;
            float sa_tok = sa[0];
#pragma unroll
            for (int r = 1; r < 8; ++r) sa_tok = tok == r ? sa[r] : sa_tok;
            const float fb = gates_row_value(acc[e], sw[h], sa_tok);
            if (seg_f) {
                if (f_out != nullptr) f_out[(long)tok * f_stride + n] = f32_to_bf16(fb);
                decay[(long)tok * decay_stride + n] = kda_decay_gate_exp_a(fb, exp_a[h], bias[h], lower_bound);
            } else {
                og[(long)tok * og_stride + n] = f32_to_bf16(fb);
            }
        }
    }
    if (block == 0)  // beta: m*H sigmoids, independent of the GEMVs
        for (int i = threadIdx.x; i < m * H; i += WARPS * 32) {
            const int r = i / H, hh = i % H;
            beta[(long)r * beta_stride + hh] = kda_beta_gate(bf16_to_f32(ld_step(b + (long)r * b_stride + hh)));
        }
}

template <int N, int K, int DK, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
kda_gates_w8a8_k128_rows(const __nv_bfloat16* xf, const __nv_bfloat16* xg,
                         int x_stride, int m,
                         const uint8_t* wf, const float* swf,
                         const uint8_t* wg, const float* swg,
                         const float* a_log, const float* dt_bias,
                         float lower_bound, const __nv_bfloat16* b, int b_stride,
                         float* decay, int decay_stride,
                         __nv_bfloat16* og, int og_stride,
                         float* beta, int beta_stride,
                         __nv_bfloat16* f_out, int f_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    kda_gates_w8a8_k128_rows_dev<N, K, DK, WARPS>(xf, xg, x_stride, m, wf, swf, wg, swg, a_log,  // pdl_wait inside
        dt_bias, lower_bound, b, b_stride, decay, decay_stride, og, og_stride, beta, beta_stride,
        f_out, f_stride, blockIdx.x);
}

// The unquantized variant (kbpc compile --no-act-quant, a debugging aid; kbpc/reference/no_act_quant.py):
//   kda_gates_dq_rows<WARPS><<<(ceil(N / WARPS), 2, m), 32 * WARPS>>>(the arguments above, then N, K, DK)
// f_n = rn_bf16(sum_k x_k fl(E4M3(W[n,k]) s_w[n])) in FP32 (lane-strided fused multiply-adds and a
// warp butterfly, one output per warp; not the reference's summation order), o_g likewise; the
// same decay and beta epilogues. blockIdx.y: 0 computes f (+ decay), 1 o_g; block (0, 0, 0) beta.
template <int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
kda_gates_dq_rows(const __nv_bfloat16* xf, const __nv_bfloat16* xg,
                  int x_stride, int m,
                  const uint8_t* wf, const float* swf,
                  const uint8_t* wg, const float* swg,
                  const float* a_log, const float* dt_bias,
                  float lower_bound, const __nv_bfloat16* b, int b_stride,
                  float* decay, int decay_stride,
                  __nv_bfloat16* og, int og_stride,
                  float* beta, int beta_stride,
                  __nv_bfloat16* f_out, int f_stride, int n_out, int k, int dk) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    const int h_count = n_out / dk;
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0)
        for (int i = threadIdx.x; i < m * h_count; i += 32 * WARPS) {
            const int r = i / h_count, h = i % h_count;
            beta[(long)r * beta_stride + h] = kda_beta_gate(bf16_to_f32(b[(long)r * b_stride + h]));
        }
    const bool seg_f = blockIdx.y == 0;
    const int lane = threadIdx.x & 31, tok = blockIdx.z;
    const int n = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (n >= n_out) return;   // warp-uniform
    const __nv_bfloat16* x = (seg_f ? xf : xg) + (long)tok * x_stride;
    const uint8_t* w = (seg_f ? wf : wg) + (size_t)n * k;
    const float s = (seg_f ? swf : swg)[n];
    float acc = 0.0f;
    for (int i = lane; i < k; i += 32) acc = __fmaf_rn(bf16_to_f32(x[i]), __fmul_rn(e4m3_to_f32(w[i]), s), acc);
    const float v = round_bf16(warp_sum_xor(acc));
    if (lane != 0) return;
    if (seg_f) {
        if (f_out != nullptr) f_out[(long)tok * f_stride + n] = f32_to_bf16(v);
        decay[(long)tok * decay_stride + n] = kda_decay_gate(v, a_log[n / dk], dt_bias[n], lower_bound);
    } else {
        og[(long)tok * og_stride + n] = f32_to_bf16(v);
    }
}

}  // namespace kbp
