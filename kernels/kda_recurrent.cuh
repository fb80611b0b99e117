// kda_recurrent.cuh: Kimi Delta Attention decode recurrence, the gated delta rule with a per-key-
// channel decay (explain.families.kda_recurrent), register-resident column form (_seq_reg).
//
// Launch contract
//   kbp::kda_recurrent_decode_bf16_seq_reg<HK, HV, DK, DV, COLS, T>(
//       q, k, v, qkv_stride, log_decay, decay_stride, beta, beta_stride, scale,
//       state, state_stride, snap, out, out_stride)
//     One sequence per grid row z, tokens t = 0..T-1 of that sequence at rows z*T + t of the inputs.
//     q, k:      (rows, HK*DK) BF16 (L2-normalised by the conv), v: (rows, HV*DV) BF16; all three
//                share the row stride qkv_stride (elements), e.g. q|k|v views of the packed conv row.
//     log_decay: (rows, HV*DK) FP32, g_t (per v-head, per key channel), row stride decay_stride.
//     beta:      (rows, HV) FP32 (already sigmoid-ed), row stride beta_stride.
//     scale:     FP32 query scale 1/sqrt(DK), computed by the host.
//     state:     (seqs, HV, DK, DV) FP32, S[h][i][j] with i the key channel and j the value column
//                (row-major, value columns contiguous); sequence stride state_stride (elements).
//                Updated in place to S_T.
//     snap:      (seqs, T-1, HV, DK, DV) FP32 snapshots S_1..S_{T-1} (T > 1 only; else nullptr).
//     out:       (rows, HV*DV) FP32, row stride out_stride.
//     grid = (HV, DV / COLS, seqs), block = (COLS); static shared memory 3*DK floats. The state
//     columns are read before pdl_wait (nothing else in the step writes them), the rest after.
//     Head h reads q/k head h / (HV / HK). DV % COLS == 0, COLS % 32 == 0, T in [1, 4].
// Math (each thread owns one value column j of one head, held in DK registers across tokens)
//   pass 1: s_i = expf(g_i) * S[i][j];  kv = sum_{i=0..DK-1} s_i * k_i   (in order, from the first term)
//           u = beta * (v_j - kv)
//   pass 2: S'[i][j] = s_i + k_i * u;   o_j = sum_{i} S'[i][j] * (q_i * scale)  (in order)
//   FP32 throughout, no FMA contraction; q, k, v widened exactly from BF16; no state clamp.
//
//   kbp::kda_recurrent_norm_decode_bf16<HK, HV, DK, DV>(q, k, v, log_decay, beta, scale, state, out,
//       gate, gamma, gamma_head_stride, eps, y)            (fusion rule kda_recurrence_norm)
//     One token of one sequence, the gated output norm (kda_o_norm.cuh) as the epilogue: q, k, v,
//     log_decay, beta, state as above (one row); out: (HV*DV) FP32 or nullptr (the recurrence's
//     output, written only when a later kernel or the debug arena keeps it); gate: (HV*DV) BF16 z;
//     gamma: BF16 (DV) shared (gamma_head_stride = 0) or (HV, DV); y: (HV*DV) BF16.
//     grid = (HV), block = (DV): one block per value head, thread j owns value column j (the
//     column math above), then y_j = the gated norm of the head's DV outputs, exactly
//     kda_o_norm_gated_bf16's. DV % 32 == 0, DV <= 1024.
// Entry points: the __global__ templates, or the body <name>_dev<...>(same arguments) for a TU's own
// extern "C" __global__ wrapper, which must carry the same __launch_bounds__.
// kda_recurrent_norm_decode_bf16 carries phase stamps (kbp_stamps.cuh): 3 token staged, 4 recurrence done.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_common.cuh"
#include "kda_o_norm.cuh"

namespace kbp {

// Stage this token's per-key-channel factors in shared memory: e^g, k and the pre-scaled query.
template <int DK, int COLS>
__device__ __forceinline__ void kda_stage_token(const __nv_bfloat16* q,
                                                const __nv_bfloat16* k,
                                                const float* g, float scale,
                                                float* s_decay, float* s_k, float* s_q) {
    for (int i = threadIdx.x; i < DK; i += COLS) {
        s_decay[i] = kbp::exp_f32(g[i]);
        s_k[i] = bf16_to_f32(k[i]);
        s_q[i] = bf16_to_f32(q[i]) * scale;
    }
}

// One token of one value column j: S[i] (key channel i) is the column, in registers (a float[DK])
// or anywhere S[i] names a float lvalue (KdaSmemColumn). Pass 1 forms kv = sum_i (e^g_i S[i]) k_i;
// u = beta (v_j - kv); pass 2 recomputes s_i = e^g_i S[i] (the same bits), stores S'[i] = s_i + k_i u
// and reads out o = sum_i S'[i] q^_i. s_decay = e^g, s_k = k, s_q = q * scale: DK floats each in
// shared memory, 16-byte aligned. Both sums start from their first term (no +0.0: bit-exact
// signed zeros). UNROLL (a divisor of DK / 4) is how many 4-row steps one loop iteration holds: a
// register column needs all of them (its indices must be constants); a shared-memory column runs
// a short loop instead, since a fully unrolled column is ~2000 straight-line instructions that a
// CTA of few warps runs once, each fetched from beyond the instruction cache (measured: most of
// the fused KDA kernel's time stalled on instruction fetch).
template <int DK, int UNROLL = DK / 4, typename Column>
__device__ __forceinline__ float kda_column_step(Column& S, const float* s_decay, const float* s_k,
                                                 const float* s_q, float vj, float beta) {
    static_assert(DK % 4 == 0, "the staged factors are read as float4");
    static_assert(UNROLL >= 1 && (DK / 4) % UNROLL == 0, "whole loop iterations");
    float kv;
#pragma unroll UNROLL
    for (int i4 = 0; i4 < DK / 4; ++i4) {  // 16-byte shared loads: fewer live registers
        const float4 d4 = reinterpret_cast<const float4*>(s_decay)[i4];
        const float4 k4 = reinterpret_cast<const float4*>(s_k)[i4];
        const float dd[4] = {d4.x, d4.y, d4.z, d4.w}, kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = (dd[e] * S[4 * i4 + e]) * kk[e];
            kv = (i4 == 0 && e == 0) ? p : kv + p;
        }
    }
    const float u = beta * (vj - kv);
    // A compiler-only barrier: pass 2 re-reads a column in memory instead of keeping pass 1's
    // DK loads live in registers (no effect on a register column).
    asm volatile("" ::: "memory");
    float o;
#pragma unroll UNROLL
    for (int i4 = 0; i4 < DK / 4; ++i4) {
        const float4 d4 = reinterpret_cast<const float4*>(s_decay)[i4];
        const float4 k4 = reinterpret_cast<const float4*>(s_k)[i4];
        const float4 q4 = reinterpret_cast<const float4*>(s_q)[i4];
        const float dd[4] = {d4.x, d4.y, d4.z, d4.w}, kk[4] = {k4.x, k4.y, k4.z, k4.w};
        const float qq[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float s = dd[e] * S[4 * i4 + e] + kk[e] * u;
            S[4 * i4 + e] = s;
            const float p = s * qq[e];
            o = (i4 == 0 && e == 0) ? p : o + p;
        }
    }
    return o;
}

// A state column in shared memory: element i at p[i * stride].
struct KdaSmemColumn {
    float* p;
    int stride;
    __device__ __forceinline__ float& operator[](int i) const { return p[i * stride]; }
};

template <int HK, int HV, int DK, int DV, int COLS, int T>
__device__ __forceinline__ void
kda_recurrent_decode_bf16_seq_reg_dev(const __nv_bfloat16* q,
                                      const __nv_bfloat16* k,
                                      const __nv_bfloat16* v, int qkv_stride,
                                      const float* log_decay, int decay_stride,
                                      const float* beta, int beta_stride, float scale,
                                      float* state, long state_stride,
                                      float* snap, float* out, int out_stride) {
    static_assert(HV % HK == 0, "each q/k head serves a whole group of value heads");
    static_assert(DV % COLS == 0 && COLS % 32 == 0, "whole warps of value columns");
    static_assert(T >= 1 && T <= 4, "one to four tokens per launch");
    static_assert(DK % 4 == 0, "the staged factors are read as float4");
    __shared__ __align__(16) float s_decay[DK], s_k[DK], s_q[DK];

    const int h = blockIdx.x, hk = h / (HV / HK);
    const int j = blockIdx.y * COLS + threadIdx.x;
    const long seq = blockIdx.z;
    float* col = state + seq * state_stride + (long)h * DK * DV + j;

    // The state is this kernel's own (the previous step's launch wrote it), so it is read before
    // pdl_wait: under PDL the column loads overlap the kernels this one waits for.
    float S[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) S[i] = col[(long)i * DV];
    pdl_wait();   // PDL: q, k, v, the gates and beta come from the previous kernels

#pragma unroll 1
    for (int t = 0; t < T; ++t) {
        const long row = seq * T + t;
        const long qk_off = row * qkv_stride + (long)hk * DK;
        if (t > 0) __syncthreads();  // every thread has finished reading the previous token's factors
        kda_stage_token<DK, COLS>(q + qk_off, k + qk_off, log_decay + row * decay_stride + (long)h * DK,
                                  scale, s_decay, s_k, s_q);
        __syncthreads();
        const float vj = bf16_to_f32(v[row * qkv_stride + (long)h * DV + j]);
        const float o = kda_column_step<DK>(S, s_decay, s_k, s_q, vj, beta[row * beta_stride + h]);
        out[row * out_stride + (long)h * DV + j] = o;
        if (t + 1 < T) {
            float* sc = snap + (seq * (T - 1) + t) * (long)HV * DK * DV + (long)h * DK * DV + j;
#pragma unroll
            for (int i = 0; i < DK; ++i) sc[(long)i * DV] = S[i];
        }
    }
#pragma unroll
    for (int i = 0; i < DK; ++i) col[(long)i * DV] = S[i];
}

template <int HK, int HV, int DK, int DV, int COLS, int T>
__global__ void __launch_bounds__(COLS)
kda_recurrent_decode_bf16_seq_reg(const __nv_bfloat16* q,
                                  const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, int qkv_stride,
                                  const float* log_decay, int decay_stride,
                                  const float* beta, int beta_stride, float scale,
                                  float* state, long state_stride,
                                  float* snap, float* out, int out_stride) {
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    kda_recurrent_decode_bf16_seq_reg_dev<HK, HV, DK, DV, COLS, T>(q, k, v, qkv_stride, log_decay,  // pdl_wait inside
        decay_stride, beta, beta_stride, scale, state, state_stride, snap, out, out_stride);
}

// (DV, 1): without the minimum of one block ptxas holds the 128-float column in 32 registers and
// spills it (3.4 KB a thread at the seed's shape; with it 255 registers, as the column form).
template <int HK, int HV, int DK, int DV>
__global__ void __launch_bounds__(DV, 1)
kda_recurrent_norm_decode_bf16(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                               const float* log_decay, const float* beta, float scale, float* state,
                               float* out, const __nv_bfloat16* gate, const __nv_bfloat16* gamma,
                               int gamma_head_stride, float eps, __nv_bfloat16* y) {
    static_assert(HV % HK == 0, "each q/k head serves a whole group of value heads");
    static_assert(DV % 32 == 0 && DV <= 1024, "one block of whole warps per value head");
    static_assert(DK % 4 == 0, "the staged factors are read as float4");
    KBP_STAMP_BEGIN();
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    __shared__ __align__(16) float s_decay[DK], s_k[DK], s_q[DK];
    const int h = blockIdx.x, hk = h / (HV / HK), j = threadIdx.x;
    float* col = state + (long)h * DK * DV + j;
    float S[DK];   // read before pdl_wait, as in the column form: the state is this kernel's own
#pragma unroll
    for (int i = 0; i < DK; ++i) S[i] = col[(long)i * DV];
    KBP_STAMP(kStampWaitIn);   // the state column's loads issued
    pdl_wait();   // PDL: q, k, v, the gates, beta and z come from the previous kernels
    KBP_STAMP(kStampWaitOut);
    kda_stage_token<DK, DV>(q + (long)hk * DK, k + (long)hk * DK, log_decay + (long)h * DK, scale,
                            s_decay, s_k, s_q);
    __syncthreads();
    KBP_STAMP(3);   // the token's e^g, k and scaled q staged in shared memory
    const float vj = bf16_to_f32(v[(long)h * DV + j]);
    const float o = kda_column_step<DK>(S, s_decay, s_k, s_q, vj, beta[h]);
#pragma unroll
    for (int i = 0; i < DK; ++i) col[(long)i * DV] = S[i];
    if (out != nullptr) out[(long)h * DV + j] = o;
    KBP_STAMP(4);   // recurrence done: the column updated and stored back (the gated norm follows)
    y[(long)h * DV + j] = kda_o_norm_head<DV>(o, gamma[(long)h * gamma_head_stride + j],
                                              gate[(long)h * DV + j], eps);
    KBP_STAMP_END();
}

}  // namespace kbp
