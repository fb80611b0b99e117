// kda_fused.cuh: the whole non-projection chain of one KDA decode layer in one launch: kda_pack ->
// causal_conv1d_l2norm -> kda_gates_w8a8 -> kda_recurrent -> kda_o_norm (explain.families of each).
// It computes the same bits as that chain of kernels (their headers' device functions are reused
// for every rounding point), for one token of one sequence.
//
// Launch contract
//   kbp::kda_fused_decode<HK, HV, DK, DV, KF, KG, W, CPH>(q, k, v, xf, xg, b, taps, conv_bias,
//       l2_eps, wf, swf, wg, swg, a_log, dt_bias, lower_bound, scale, gamma, gamma_head_stride,
//       norm_eps, window, state, y, packed, conv_out, f_out, decay_out, beta_out, og_out, core_out)
//     q, k:    (HK*DK) BF16 projection rows;  v: (HV*DV) BF16.  Channel layout of the packed row and
//              of the conv window: [q | k | v], C = 2*HK*DK + HV*DV channels.
//     xf, xg:  (KF), (KG) BF16 low-rank gate rows (f_a, g_a), 16-byte aligned;  b: (HV) BF16 beta logits.
//     taps:    (C, W) BF16 conv weights (tap i multiplies window slot i, oldest first);
//              conv_bias: (C) BF16 or nullptr (the sum then starts from +0.0).
//     wf, swf: (HV*DK, KF) E4M3 codes (16-byte aligned rows), (HV*DK) FP32 row scales: f = W_f x_f;
//     wg, swg: (HV*DV, KG) E4M3, (HV*DV) FP32: the output gate o_g = W_g x_g.
//     a_log:   (HV) FP32 A;  dt_bias: (HV*DK) FP32 delta;  lower_bound: lambda < 0.
//     scale:   FP32 query scale 1/sqrt(DK), from the host (kbpc.reference.kda_recurrent.query_scale).
//     gamma:   BF16 norm weight, (DV) shared (gamma_head_stride = 0) or (HV, DV) (stride DV).
//     window:  (C, W) FP32 conv state, advanced in place (16-byte aligned when W == 4).
//     state:   (HV, DK, DV) FP32 recurrent state S[h][i][j] (i key channel, j value column), in place.
//     y:       (HV*DV) BF16, the gated output norm: the chain's only required output.
//     packed, conv_out (C) BF16; f_out, decay_out (HV*DK) BF16/FP32; beta_out (HV) FP32;
//     og_out (HV*DV) BF16; core_out (HV*DV) FP32: the chain's intermediate tensors, each written
//              only when not nullptr (a plan that keeps one as a buffer, or a test).
//     grid = (kda_fused_blocks<...>()) = HK * CLUSTER, block = (COLS), static shared memory only;
//     compile-time clusters of CLUSTER = (HV / HK) * CPH CTAs (__cluster_dims__), one per key head.
//     Requires HV % HK == 0, DV % CPH == 0 with COLS = DV / CPH a multiple of 32, (DK / CPH) % 16
//     == 0, DK % 32 == 0, DV <= 1024, KF % 128 == 0, KG % 128 == 0, CLUSTER <= 8, and the static
//     shared memory sizeof(KdaFusedSmem) (about 4 * DK * COLS bytes) within 48 KB.
// Work split: cluster c serves key head c and its HV/HK value heads; CTA rank r serves value head
// hv = c * HV/HK + r / CPH, slice s = r % CPH: value columns j in [s*COLS, (s+1)*COLS) (one thread
// each; the CTA's DK x COLS state slice is staged in shared memory by cp.async while the conv and
// gates run, updated there, and written back with 16-byte stores) and f rows [s*DK/CPH,
// (s+1)*DK/CPH) of the head (decay tiles; o_g tiles are the CTA's own columns). Every CTA of the
// cluster computes the key head's q and k conv + L2 norm itself (2*DK channels, from the old
// window); one CTA per 32-channel chunk writes the advanced window at the end, after the cluster
// barriers, so no CTA can read a window another has already advanced. e^g and the o-norm's warp
// sums cross the CTAs of a head through distributed shared memory.
// Barriers: #1 and #2 are cluster barriers with release/acquire (shared-memory hand-offs); every
// global store of the product path comes after #2, so neither waits for pending stores. #3 is a
// relaxed arrive/wait that only keeps shared memory alive until the other CTAs have read it.
// Math and rounding points: exactly those of the five kernels (see their headers):
//   conv:  a = bias + sum_i tap_i s_i; u = silu(a); q/k heads y = rn_bf16(u * rsqrt(ss + eps)) with
//          ss the warp shuffle-down trees of 32 channels added in order; v = rn_bf16(u).
//   gates: E4M3 row quantization and mma.sync m16n8k32 tiles of kda_gates_w8a8 (the same instruction
//          sequence on the same operands: the same bits); decay and beta epilogues as there.
//   recurrence: kda_column_step (per-column FP32 sums in key order); o-norm: shuffle-down tree per
//          32 columns, the DV/32 warp sums by a second shuffle-down tree, rsqrt(ss/DV + eps).
// PDL: before pdl_wait() the weights and taps are loaded, the window rows prefetched into L2 and
// the state slice copied into shared memory (cp.async): the state and the window are this kernel's
// own, no other kernel of the step writes them. Every load of a step input and every global write
// comes after it; dependents are released after barrier #1.
// Code size: a CTA has only COLS/32 warps and runs its code once, so instruction fetch bounds it
// when the code is long and straight (measured with ncu on an H200: 7768 instructions, a third of
// the stall samples waiting on instruction fetch, 44 us alone). The recurrence therefore runs as a
// short loop over the shared-memory column and each token row is quantized by the whole warp:
// 5200 instructions, instruction-fetch stalls 36% -> 9% of the samples, 19.4 us alone.
// Entry point: the __global__ template only (its cluster shape is part of it); GPU tests launch it
// through the product's launcher (kbpc.testing.launchers).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "causal_conv1d_l2norm.cuh"
#include "kbp_common.cuh"
#include "kda_gates_w8a8.cuh"
#include "kda_o_norm.cuh"
#include "kda_recurrent.cuh"

namespace kbp {

// The work split of one instance (see the header comment).
template <int HK, int HV, int DK, int DV, int CPH>
struct KdaFusedSplit {
    static constexpr int GROUP = HV / HK;             // value heads per key head
    static constexpr int CLUSTER = GROUP * CPH;       // CTAs per key head
    static constexpr int COLS = DV / CPH;             // value columns (threads) per CTA
    static constexpr int WARPS = COLS / 32;
    static constexpr int F_ROWS = DK / CPH;           // decay rows per CTA
    static constexpr int F_TILES = F_ROWS / 16;       // 16-row MMA tiles of decay rows
    static constexpr int G_TILES = COLS / 16;         // 16-row MMA tiles of o_g rows
    static constexpr int TF = (F_TILES + WARPS - 1) / WARPS, TG = (G_TILES + WARPS - 1) / WARPS;  // per warp
    static constexpr int QK_CHUNKS = 2 * DK / 32;     // 32-channel chunks of the q and k heads
    static constexpr int QK_PER_WARP = (QK_CHUNKS + WARPS - 1) / WARPS;
    static constexpr int C = 2 * HK * DK + HV * DV;   // packed channels
};

template <int HK, int HV, int DK, int DV, int CPH>
__host__ __device__ constexpr int kda_fused_blocks() {
    return HK * KdaFusedSplit<HK, HV, DK, DV, CPH>::CLUSTER;
}
template <int HK, int HV, int DK, int DV, int CPH>
__host__ __device__ constexpr int kda_fused_threads() { return KdaFusedSplit<HK, HV, DK, DV, CPH>::COLS; }

// (cp_async16 / cp_async_commit / cp_async_wait_all: kbp_common.cuh)
// (cluster_arrive_relaxed / cluster_wait, the last barrier's halves: kbp_common.cuh)

// The kernel's arguments (see the launch contract), gathered for the phase functions below.
struct KdaFusedParams {
    const __nv_bfloat16 *q, *k, *v, *xf, *xg, *b, *taps, *conv_bias;
    float l2_eps;
    const uint8_t* wf; const float* swf; const uint8_t* wg; const float* swg;
    const float *a_log, *dt_bias;
    float lower_bound, scale;
    const __nv_bfloat16* gamma; int gamma_head_stride; float norm_eps;
    float *window, *state;
    __nv_bfloat16* y;
    __nv_bfloat16 *packed, *conv_out, *f_out; float *decay_out, *beta_out;
    __nv_bfloat16* og_out; float* core_out;
};

// Where this thread sits (see "Work split").
template <int HK, int HV, int DK, int DV, int CPH>
struct KdaFusedPlace {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
    int rank, hk, hv, slice, first_rank, tid, warp, lane, g, t, j, vc, f_row0, g_row0;
    __device__ __forceinline__ KdaFusedPlace(int cluster_rank) {
        rank = cluster_rank;
        hk = blockIdx.x / Sp::CLUSTER;
        hv = hk * Sp::GROUP + rank / CPH;
        slice = rank % CPH;
        first_rank = (rank / CPH) * CPH;           // slice 0 of this value head
        tid = threadIdx.x; warp = tid / 32; lane = tid % 32; g = lane / 4; t = lane % 4;
        j = slice * Sp::COLS + tid;                // this thread's value column
        vc = 2 * HK * DK + hv * DV + j;            // its packed channel
        f_row0 = hv * DK + slice * Sp::F_ROWS;     // first f row of this CTA
        g_row0 = hv * DV + slice * Sp::COLS;       // first o_g row
    }
    // Packed channel of q/k chunk channel ch (0..2*DK-1): q head hk, then k head hk.
    __device__ __forceinline__ int qk_channel(int ch) const {
        return ch < DK ? hk * DK + ch : HK * DK + hk * DK + ch - DK;
    }
};

// Shared memory of one CTA.
template <int DK, int COLS, int W, int QK_CHUNKS, int F_ROWS>
struct KdaFusedSmem {
    alignas(16) float state[DK][COLS];            // this CTA's state columns S[i][j]
    alignas(16) float decay[DK], k[DK], q[DK];    // e^g, k, q * scale: the recurrence's factors
    float qk_u[2 * DK], qk_win[W][2 * DK];        // q/k conv outputs and advanced windows
    float qk_part[QK_CHUNKS];                     // warp sums of squares of the q/k chunks
    float e_decay[F_ROWS];                        // this CTA's rows of e^g (read by the head)
    float og[COLS];                               // output gate of this CTA's columns
    float on_part[COLS / 32];                     // o-norm warp sums (read by the head)
};

// Registers loaded before the dependency wait: weights only (no kernel of the step writes them).
template <int KF, int KG, int W, int TF, int TG, int QKW>
struct KdaFusedWeights {
    GatesTile<KF> f[TF];
    GatesTile<KG> og[TG];
    float swf[TF][2], dt[TF][2], swg[TG][2];      // epilogue scales of rows n0+g and n0+g+8
    __nv_bfloat16 qk_taps[QKW][W], v_taps[W];
    float qk_bias[QKW], v_bias, a_log;
};

template <int HK, int HV, int DK, int DV, int KF, int KG, int W, int CPH, typename Wts>
__device__ __forceinline__ void kda_fused_load_weights(const KdaFusedParams& p,
                                                       const KdaFusedPlace<HK, HV, DK, DV, CPH>& at, Wts& w) {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
#pragma unroll
    for (int i = 0; i < Sp::TF; ++i) {
        const int tile = at.warp + i * Sp::WARPS, n0 = at.f_row0 + 16 * tile;
        if (tile < Sp::F_TILES) {
            gates_tile_load<KF>(p.wf, n0, at.g, at.t, w.f[i]);
            for (int e = 0; e < 2; ++e) { w.swf[i][e] = p.swf[n0 + at.g + 8 * e]; w.dt[i][e] = p.dt_bias[n0 + at.g + 8 * e]; }
        }
    }
#pragma unroll
    for (int i = 0; i < Sp::TG; ++i) {
        const int tile = at.warp + i * Sp::WARPS, n0 = at.g_row0 + 16 * tile;
        if (tile < Sp::G_TILES) {
            gates_tile_load<KG>(p.wg, n0, at.g, at.t, w.og[i]);
            for (int e = 0; e < 2; ++e) w.swg[i][e] = p.swg[n0 + at.g + 8 * e];
        }
    }
#pragma unroll
    for (int r = 0; r < Sp::QK_PER_WARP; ++r) {
        const int chunk = at.warp + r * Sp::WARPS, c = at.qk_channel(chunk * 32 + at.lane);
        if (chunk < Sp::QK_CHUNKS) {
            conv_taps_load<W>(p.taps + (long)c * W, w.qk_taps[r]);
            w.qk_bias[r] = conv_bias_value(p.conv_bias, c);
        }
    }
    conv_taps_load<W>(p.taps + (long)at.vc * W, w.v_taps);
    w.v_bias = conv_bias_value(p.conv_bias, at.vc);
    w.a_log = p.a_log[at.hv];
}

// The gate tiles of this warp: f rows -> e^decay (shared memory), o_g rows -> og (shared memory).
template <int HK, int HV, int DK, int DV, int KF, int KG, int CPH, typename Wts, typename Smem>
__device__ __forceinline__ void kda_fused_gates(const KdaFusedParams& p,
                                                const KdaFusedPlace<HK, HV, DK, DV, CPH>& at, const Wts& w,
                                                Smem& sm, const uint2 (&rf)[KF / 128],
                                                const uint2 (&rg)[KG / 128]) {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
    {
        uint32_t xq[KF / 128][8];
        const float sa = quantize_row_warp<KF>(rf, at.g, at.t, xq);
#pragma unroll
        for (int i = 0; i < Sp::TF; ++i) {
            const int tile = at.warp + i * Sp::WARPS, n0 = at.f_row0 + 16 * tile;
            if (tile >= Sp::F_TILES) break;  // warp-uniform
            float acc[4];
            gates_tile_mma<KF>(w.f[i], xq, acc);
#pragma unroll
            for (int e = 0; e < 2 && at.t == 0; ++e) {  // token 0 is MMA column 0: acc[0] row n0+g, acc[2] n0+g+8
                const int n = n0 + at.g + 8 * e;
                const float fb = gates_row_value(acc[2 * e], w.swf[i][e], sa);
                const float dec = kda_decay_gate(fb, w.a_log, w.dt[i][e], p.lower_bound);
                sm.e_decay[n - at.f_row0] = kbp::exp_f32(dec);
                if (p.f_out != nullptr) p.f_out[n] = f32_to_bf16(fb);
                if (p.decay_out != nullptr) p.decay_out[n] = dec;
            }
        }
    }
    uint32_t xq[KG / 128][8];
    const float sa = quantize_row_warp<KG>(rg, at.g, at.t, xq);
#pragma unroll
    for (int i = 0; i < Sp::TG; ++i) {
        const int tile = at.warp + i * Sp::WARPS, n0 = at.g_row0 + 16 * tile;
        if (tile >= Sp::G_TILES) break;
        float acc[4];
        gates_tile_mma<KG>(w.og[i], xq, acc);
#pragma unroll
        for (int e = 0; e < 2 && at.t == 0; ++e) {
            const int n = n0 + at.g + 8 * e;
            const float og = gates_row_value(acc[2 * e], w.swg[i][e], sa);
            sm.og[n - at.g_row0] = og;
            if (p.og_out != nullptr) p.og_out[n] = f32_to_bf16(og);
        }
    }
}

// The conv of this CTA's value channel and of the key head's q/k chunks (from the old window), and
// the gate tiles: results in shared memory (q/k) and registers (v_j, the value window).
template <int HK, int HV, int DK, int DV, int KF, int KG, int W, int CPH, typename Wts, typename Smem>
__device__ __forceinline__ float kda_fused_conv_gates(const KdaFusedParams& p,
                                                      const KdaFusedPlace<HK, HV, DK, DV, CPH>& at,
                                                      const Wts& w, Smem& sm, float (&v_win)[W]) {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
    constexpr int QKW = Sp::QK_PER_WARP;
    // Every load first (one round trip): inputs, windows, the token rows of the gates.
    const __nv_bfloat16 xv = p.v[at.hv * DV + at.j];
    float v_old[W], qk_old[QKW][W];
    __nv_bfloat16 xc[QKW];
    conv_window_load<W>(p.window + (long)at.vc * W, v_old);
#pragma unroll
    for (int r = 0; r < QKW; ++r) {
        const int chunk = at.warp + r * Sp::WARPS, ch = chunk * 32 + at.lane;
        if (chunk < Sp::QK_CHUNKS) {
            xc[r] = ch < DK ? p.q[at.hk * DK + ch] : p.k[at.hk * DK + ch - DK];
            conv_window_load<W>(p.window + (long)at.qk_channel(ch) * W, qk_old[r]);
        }
    }
    uint2 rf[KF / 128], rg[KG / 128];
    load_row_warp<KF>(p.xf, at.lane, rf);
    load_row_warp<KG>(p.xg, at.lane, rg);

    conv_window_shift<W>(v_old, bf16_to_f32(xv), v_win);
    const float vj = round_bf16(conv_silu(conv_window_dot<W>(w.v_bias, v_win, w.v_taps)));
    if (p.packed != nullptr) p.packed[at.vc] = xv;
    if (p.conv_out != nullptr) p.conv_out[at.vc] = f32_to_bf16(vj);
#pragma unroll
    for (int r = 0; r < QKW; ++r) {
        const int chunk = at.warp + r * Sp::WARPS, ch = chunk * 32 + at.lane;
        if (chunk < Sp::QK_CHUNKS) {  // warp-uniform
            float win[W];
            conv_window_shift<W>(qk_old[r], bf16_to_f32(xc[r]), win);
#pragma unroll
            for (int i = 0; i < W; ++i) sm.qk_win[i][ch] = win[i];
            const float u = conv_silu(conv_window_dot<W>(w.qk_bias[r], win, w.qk_taps[r]));
            sm.qk_u[ch] = u;
            const float sq = warp_sum_down(u * u);
            if (at.lane == 0) sm.qk_part[chunk] = sq;
            if (p.packed != nullptr && chunk % Sp::CLUSTER == at.rank) p.packed[at.qk_channel(ch)] = xc[r];
        }
    }
    kda_fused_gates<HK, HV, DK, DV, KF, KG, CPH>(p, at, w, sm, rf, rg);
    return vj;
}
// After barrier #1: the q/k L2 norm (bf16 q and k, q pre-scaled) and e^g of the head gathered from
// its CPH CTAs, into the recurrence's factor arrays.
template <int HK, int HV, int DK, int DV, int CPH, typename Cluster, typename Smem>
__device__ __forceinline__ void kda_fused_stage_factors(const KdaFusedParams& p,
                                                        const KdaFusedPlace<HK, HV, DK, DV, CPH>& at,
                                                        Cluster& cluster, Smem& sm) {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
#pragma unroll
    for (int r = 0; r < Sp::QK_PER_WARP; ++r) {
        const int chunk = at.warp + r * Sp::WARPS, ch = chunk * 32 + at.lane, is_k = ch >= DK;
        if (chunk < Sp::QK_CHUNKS) {
            const float yq = round_bf16(sm.qk_u[ch] * l2_head_scale<DK / 32>(sm.qk_part + is_k * (DK / 32), p.l2_eps));
            if (is_k) sm.k[ch - DK] = yq;
            else sm.q[ch] = yq * p.scale;
            if (p.conv_out != nullptr && chunk % Sp::CLUSTER == at.rank) p.conv_out[at.qk_channel(ch)] = f32_to_bf16(yq);
        }
    }
    for (int i = at.tid; i < DK; i += Sp::COLS)
        sm.decay[i] = *cluster.map_shared_rank(&sm.e_decay[i % Sp::F_ROWS], at.first_rank + i / Sp::F_ROWS);
}

template <int HK, int HV, int DK, int DV, int KF, int KG, int W, int CPH>
__device__ __forceinline__ void kda_fused_decode_body(const KdaFusedParams& p) {
    using Sp = KdaFusedSplit<HK, HV, DK, DV, CPH>;
    constexpr int COLS = Sp::COLS, WARPS = Sp::WARPS, F_ROWS = Sp::F_ROWS;
    constexpr int V4 = COLS / 4;  // 16-byte pieces of a state row slice
    static_assert(HV % HK == 0 && DV % CPH == 0 && COLS % 32 == 0, "whole warps of value columns");
    static_assert(F_ROWS * CPH == DK && F_ROWS % 16 == 0, "whole 16-row tiles of decay rows per CTA");
    static_assert(DK % 32 == 0 && DV <= 1024 && W >= 1, "32-channel norm chunks; DV/32 warp sums");
    static_assert(KF % 128 == 0 && KG % 128 == 0, "128-wide K chunks of the gate GEMVs");
    static_assert(Sp::CLUSTER >= 1 && Sp::CLUSTER <= 8, "a portable cluster");
    using Smem = KdaFusedSmem<DK, COLS, W, Sp::QK_CHUNKS, F_ROWS>;
    static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory: the state slice must fit");
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    __shared__ Smem sm;
    const KdaFusedPlace<HK, HV, DK, DV, CPH> at((int)cluster.block_rank());
    float* const state_slice = p.state + (long)at.hv * DK * DV + at.slice * COLS;

    // Before the dependency wait: weights into registers, and the state and window rows into L2
    // (a prefetch reads nothing into the kernel).
    KdaFusedWeights<KF, KG, W, Sp::TF, Sp::TG, Sp::QK_PER_WARP> w;
    kda_fused_load_weights<HK, HV, DK, DV, KF, KG, W, CPH>(p, at, w);
    prefetch_l2(p.window + (long)(at.vc - at.tid) * W, (size_t)COLS * W * 4, at.tid, COLS);
    for (int part = 0; part < 2; ++part)  // the key head's q and k channels
        prefetch_l2(p.window + (long)(part * HK * DK + at.hk * DK) * W, (size_t)DK * W * 4, at.tid, COLS);
    // The state slice, copied to shared memory while the previous kernel drains and the conv and
    // the gates run: the state is this kernel's own (no other kernel of the step writes it).
    for (int idx = at.tid; idx < DK * V4; idx += COLS)
        cp_async16(&sm.state[idx / V4][4 * (idx % V4)], state_slice + (long)(idx / V4) * DV + 4 * (idx % V4));
    cp_async_commit();
    pdl_wait();
    float v_win[W];
    const float vj = kda_fused_conv_gates<HK, HV, DK, DV, KF, KG, W, CPH>(p, at, w, sm, v_win);
    const float beta = kda_beta_gate(bf16_to_f32(p.b[at.hv]));
    if (p.beta_out != nullptr && at.slice == 0 && at.tid == 0) p.beta_out[at.hv] = beta;

    // #1: q/k partials, e^g and o_g visible across the cluster; every CTA has read the old q/k
    // window. (A release waits for this thread's pending global stores: the product has none.)
    cluster.sync();
    pdl_launch_dependents();
    kda_fused_stage_factors<HK, HV, DK, DV, CPH>(p, at, cluster, sm);
    cp_async_wait_all();
    __syncthreads();

    // The recurrence on column j, in place in shared memory, then the o-norm's warp sum.
    KdaSmemColumn column{&sm.state[0][at.tid], COLS};
    const float o = kda_column_step<DK, 2>(column, sm.decay, sm.k, sm.q, vj, beta);   // a short loop: see there
    if (p.core_out != nullptr) p.core_out[at.hv * DV + at.j] = o;
    const float sq = warp_sum_down(o * o);
    if (at.lane == 0) sm.on_part[at.warp] = sq;
    cluster.sync();  // #2: the head's warp sums visible; the new state slice complete

    // Gated o-norm: the DV/32 warp sums of the head (zero-padded to 32 lanes) by a second
    // shuffle-down tree, redone by every warp.
    const float part = at.lane < DV / 32
        ? *cluster.map_shared_rank(&sm.on_part[at.lane % WARPS], at.first_rank + at.lane / WARPS) : 0.0f;
    const float ss = __shfl_sync(0xffffffffu, warp_sum_down(part), 0);
    cluster_arrive_relaxed();  // #3 begins: this CTA's reads of the others are done
    p.y[at.hv * DV + at.j] = o_norm_gated(o, o_norm_scale<DV>(ss, p.norm_eps),
                                          p.gamma[at.hv * p.gamma_head_stride + at.j], f32_to_bf16(sm.og[at.tid]));

    // Global state and window writes last, so that no barrier above waited for them.
    for (int idx = at.tid; idx < DK * V4; idx += COLS)
        *reinterpret_cast<float4*>(state_slice + (long)(idx / V4) * DV + 4 * (idx % V4)) =
            *reinterpret_cast<const float4*>(&sm.state[idx / V4][4 * (idx % V4)]);
    conv_window_store<W>(p.window + (long)at.vc * W, v_win);
#pragma unroll
    for (int r = 0; r < Sp::QK_PER_WARP; ++r) {
        const int chunk = at.warp + r * WARPS, ch = chunk * 32 + at.lane;
        if (chunk < Sp::QK_CHUNKS && chunk % Sp::CLUSTER == at.rank) {
            float win[W];
#pragma unroll
            for (int i = 0; i < W; ++i) win[i] = sm.qk_win[i][ch];
            conv_window_store<W>(p.window + (long)at.qk_channel(ch) * W, win);
        }
    }
    cluster_wait();  // #3: no CTA leaves while another may still read its shared memory
}

template <int HK, int HV, int DK, int DV, int KF, int KG, int W, int CPH>
__global__ void __launch_bounds__(DV / CPH) __cluster_dims__((HV / HK) * CPH, 1, 1)
kda_fused_decode(const __nv_bfloat16* q, const __nv_bfloat16* k,
                 const __nv_bfloat16* v, const __nv_bfloat16* xf,
                 const __nv_bfloat16* xg, const __nv_bfloat16* b,
                 const __nv_bfloat16* taps, const __nv_bfloat16* conv_bias,
                 float l2_eps, const uint8_t* wf, const float* swf,
                 const uint8_t* wg, const float* swg,
                 const float* a_log, const float* dt_bias, float lower_bound,
                 float scale, const __nv_bfloat16* gamma, int gamma_head_stride,
                 float norm_eps, float* window, float* state,
                 __nv_bfloat16* y, __nv_bfloat16* packed,
                 __nv_bfloat16* conv_out, __nv_bfloat16* f_out,
                 float* decay_out, float* beta_out,
                 __nv_bfloat16* og_out, float* core_out) {
    const KdaFusedParams p{q, k, v, xf, xg, b, taps, conv_bias, l2_eps, wf, swf, wg, swg, a_log, dt_bias,
                           lower_bound, scale, gamma, gamma_head_stride, norm_eps, window, state, y,
                           packed, conv_out, f_out, decay_out, beta_out, og_out, core_out};
    kda_fused_decode_body<HK, HV, DK, DV, KF, KG, W, CPH>(p);
}

}  // namespace kbp
