// glm_moe_layer.cuh: a GLM MoE layer (router, 8 routed + shared expert, combine) in two launches.
// Reference: kbpc.reference.glm_moe_layer (the existing families composed; every byte matches the
// unfused chain: router GEMV -> top-k, act_quant -> routed gate_up, SwiGLU-clamp -> act_quant ->
// routed down, shared expert pair, combine).
//
// Launch contract: kbp::moe_layer<H, I, ISH, E, TOPK, M, PG, SG, PD, SD>(phase, ...) is launched
//   twice on one stream with the same arguments: phase 0 (moe_gate_up) then phase 1 (moe_down).
//   Block 256; dynamic shared memory moe_gate_up_smem<..PG, SG>() / moe_down_smem<..PD, SD>()
//   bytes (> 48 KB: the launcher raises cudaFuncAttributeMaxDynamicSharedMemorySize); any 1-D
//   grid (work is claimed dynamically; 2 CTAs per SM fill an H200: grid = 2 * SMs). PDL: weights
//   are prefetched into L2 before pdl_wait, dependents are released right after it. Launches of
//   one instance (one TU) must not overlap: it keeps its counters and scratch in the TU, and the
//   last CTA resets the counters (graph replays start clean).
//   Shapes (template): H hidden (gate_up K, down N), I routed intermediate, ISH shared intermediate
//   (0: no shared expert), E experts, TOPK slots per token, M tokens, PG / PD the K parts of the
//   routed gate_up / down GEMVs (1, 2, 4, 8: more, smaller work items when N is small; the bits
//   do not depend on them), SG / SD the cp.async ring depths. H % 128 == 0, I % 128 == 0,
//   ISH % 16 == 0, E <= 1024, TOPK <= 32. Router weights BF16; expert weights NVFP4, plain layout.
//   Arguments: phase, xn [M][H] bf16, w_router [E][H] bf16, bias [E] f32, routed_scale, gamma_gu
//     (the gate_up's static activation scale), gate_up codes [E][2I][H/2], scales [E][2I][H/16],
//     s_g [E] f32, gamma_dn, limit (swiglu_limit), down codes [E][H][I/2], scales [E][H][I/16],
//     s_g [E] f32, shared gate_up codes [2ISH][H/2], scales [2ISH][H/16], s_g, shared down codes
//     [H][ISH/2], scales [H][ISH/16], s_g, y [M][H] bf16 (out), prefetch_rows (phase 0 prefetches
//     the first rows of every routed expert's down weight into L2 as its CTAs leave; 0: none),
//     then the taps, each nullptr or a buffer: logits [M][E] f32, topk_w [M][TOPK] f32, topk_id
//     [M][TOPK] i32, dn_codes [M*TOPK][I/2], dn_scales [M*TOPK][I/16], sh_x [M][ISH] f32, egu
//     [M*TOPK][2I] bf16, sgu [M][2ISH] bf16, edown [M*TOPK][H] bf16, sdown [M][H] bf16. A null
//     tap lives in the instance's scratch (egu / sgu are then not written at all).
//
// Phase 0, moe_gate_up (moe_gate_up_dev):
//   1. router units (claimed): logits = dense_gemv_bf16<H, float> (4 experts a unit), and the
//      static NVFP4 quantization of xn under gamma_gu (256 groups a unit, into TU scratch); the
//      unit that completes the set runs router_topk_row for every token and raises a flag.
//   2. shared gate_up items (8 gate + 8 up rows, W4A16 16-value chunk walk, w4a16_gemv's order):
//      sh_x = silu(min(g, L)) * clamp(u, -L, L) in FP32 (w4a16_gemv_silu_clamp_input's input).
//      ALU-bound work: it fills the wait for the router; what is left runs after the routed items.
//   3. after the flag, routed items: 16 gate + 16 up rows of slot s, gate_up = rn_bf16(sum *
//      f32(gamma_gu * s_g)), h = rn_bf16(swiglu_clamp_element(g, u, L)), the 16 h values quantized
//      as one NVFP4 group under gamma_dn (nvfp4_quant_group) into dn_codes / dn_scales.
// Phase 1, moe_down (moe_down_dev): shared down items (16 rows, w4a16_gemv_silu_clamp_input's
//   order from sh_x; one CTA in MOE_SHARED_EVERY starts with them while the others stream the
//   routed weights), routed down items (32 rows of slot s: rn_bf16(sum * f32(gamma_dn * s_g)));
//   the last of a tile's TOPK (+2 shared) arrivals combines: y = rn_bf16(sum over live slots in
//   order fl(w * e) + sh) (moe_combine_body).
// Slots with id -1 produce +0 rows (no weight loads) and are skipped by the combine.
#pragma once

#include "dense_bf16.cuh"
#include "glm_router_topk.cuh"
#include "glm_swiglu_clamp.cuh"
#include "w4a16_gemv.cuh"
#include "w4a4_moe_stream.cuh"

namespace kbp {

__host__ __device__ constexpr size_t moe_align16(size_t n) { return (n + 15) & ~(size_t)15; }

constexpr int MOE_SHARED_EVERY = 4;  // phase 1: one CTA in 4 starts with the shared down items

// Dynamic shared memory: the ring, then `groups` staged activation groups (MOE_ACT_BYTES each),
// then the pipeline state.
template <int STAGES>
__host__ __device__ constexpr size_t moe_smem_bytes(int groups) {
    return (size_t)STAGES * MOE_STAGE_BYTES + moe_align16((size_t)groups * MOE_ACT_BYTES) +
           moe_align16(sizeof(MoePipeSmem<STAGES>));
}

template <int H, int I, int ISH, int E, int TOPK, int M, int P>
struct MoeGateUpShape {
    static_assert(H % 128 == 0 && I % 128 == 0 && ISH % 16 == 0, "MoE layer sizes");
    static_assert(M >= 1 && TOPK >= 1 && E >= 1, "MoE layer counts");
    static constexpr int S = M * TOPK;             // routed slots
    static constexpr int T = I / 16;               // tiles of a slot: 16 gate + 16 up rows
    static constexpr int NG = H / 16;              // activation groups of a token
    static constexpr int EB = (E + 3) / 4;         // router GEMV units of a token (4 experts)
    static constexpr int QB = (NG + 255) / 256;    // quantization units of a token
    static constexpr int RU = M * (EB + QB);
    static constexpr int SH = M * (ISH / 8);       // shared items: 8 gate + 8 up rows
};

template <int H, int I, int ISH, int TOPK, int M, int P>
struct MoeDownShape {
    static_assert(H % 128 == 0 && I % 128 == 0 && ISH % 16 == 0, "MoE layer sizes");
    static constexpr int S = M * TOPK;
    static constexpr int T = H / 32;               // tiles of a slot: 32 rows
    static constexpr int NG = I / 16;
    static constexpr int SH = M * (ISH > 0 ? H / 16 : 0);      // shared items: 16 rows
    static constexpr unsigned TARGET = TOPK + (ISH > 0 ? 2 : 0);  // arrivals that complete a tile
};

template <int H, int I, int ISH, int E, int TOPK, int M, int P, int STAGES>
__host__ __device__ constexpr size_t moe_gate_up_smem() { return moe_smem_bytes<STAGES>(M * (H / 16)); }
template <int H, int I, int ISH, int TOPK, int M, int P, int STAGES>
__host__ __device__ constexpr size_t moe_down_smem() { return moe_smem_bytes<STAGES>(M * TOPK * (I / 16)); }

namespace {  // internal linkage: each TU (kernel instance) owns its counters and scratch
template <int H, int I, int ISH, int E, int TOPK, int M, int P>
struct MoeGateUpState {
    using Sh = MoeGateUpShape<H, I, ISH, E, TOPK, M, P>;
    unsigned claim_router, router_done, claim_shared, claim_routed, flag, exits;
    float logits[M * E];
    uint2 xq_codes[M * Sh::NG];
    uint8_t xq_scales[M * Sh::NG];
    float gpart[P > 1 ? Sh::S * Sh::T * 256 : 1];
    unsigned cnt[P > 1 ? Sh::S * Sh::T : 1];
};
template <int H, int I, int ISH, int E, int TOPK, int M, int P>
__device__ MoeGateUpState<H, I, ISH, E, TOPK, M, P> moe_gate_up_state;

template <int H, int I, int ISH, int TOPK, int M, int P>
struct MoeDownState {
    using Sh = MoeDownShape<H, I, ISH, TOPK, M, P>;
    unsigned claim_shared, claim_routed, exits;
    unsigned cnt_tile[M * Sh::T];
    float gpart[P > 1 ? Sh::S * Sh::T * 256 : 1];
    unsigned cnt[P > 1 ? Sh::S * Sh::T : 1];
};
template <int H, int I, int ISH, int TOPK, int M, int P>
__device__ MoeDownState<H, I, ISH, TOPK, M, P> moe_down_state;
}  // namespace

__device__ __forceinline__ void moe_require_smem(size_t need) {
    unsigned have;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(have));
    if (have < need) __trap();
}

// The last CTA to leave resets the kernel's counters (`reset` runs in that CTA's thread 0).
template <class Reset>
__device__ __forceinline__ void moe_leave(unsigned* exits, Reset reset) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(exits, 1u) == gridDim.x - 1) {
            reset();
            __threadfence();
        }
    }
}

// Warp-wide arrival at a counter after the warp's writes (and whatever a CTA barrier before them
// ordered): lane 0 releases them; true in every lane of the warp that brings the counter to
// `target` (which resets it), the other arrivals' writes then visible to the warp.
__device__ __forceinline__ bool moe_warp_arrive(unsigned* cnt, unsigned target) {
    __syncwarp();
    unsigned old = 0;
    if ((threadIdx.x & 31) == 0) {
        __threadfence();
        old = atomicAdd(cnt, 1u);
        if (old == target - 1) *cnt = 0u;
    }
    old = __shfl_sync(0xffffffffu, old, 0);
    const bool last = old == target - 1;
    if (last) __threadfence();
    return last;
}

// ------------------------------------------------------------------ gate_up: router phase

template <int H, int E, int TOPK, int M, int EB, int QB>
__device__ __forceinline__ void moe_router_unit(int u, const __nv_bfloat16* xn, const __nv_bfloat16* w_router,
                                                float* logits, float gamma, float inv_g, uint2* xq_codes,
                                                uint8_t* xq_scales) {
    constexpr int NG = H / 16;
    const int t = u / (EB + QB), b = u % (EB + QB);
    if (b < EB) {
        dense_gemv_bf16_block<H, float>(w_router, xn + (size_t)t * H, logits + (size_t)t * E, E, b);
    } else {
        const int g = (b - EB) * MOE_THREADS + threadIdx.x;
        if (g < NG)
            nvfp4_quant_row_group(xn + (size_t)t * H, g, gamma, inv_g,
                                  reinterpret_cast<uint8_t*>(xq_codes + (size_t)t * NG), xq_scales + (size_t)t * NG);
    }
}

// Top-k of every token once the last router unit is in (all threads of that CTA), then the flag.
template <int E, int TOPK, int M>
__device__ __forceinline__ void moe_router_topk(const float* logits, const float* bias, float routed_scale,
                                                float* topk_w, int* topk_id, unsigned* flag) {
    __shared__ float lg[E];
    for (int t = 0; t < M; ++t) {
        for (int e = threadIdx.x; e < E; e += MOE_THREADS) lg[e] = __ldcg(logits + (size_t)t * E + e);
        __syncthreads();
        router_topk_row<E, TOPK, MOE_THREADS>(lg, bias, routed_scale, topk_w + t * TOPK, topk_id + t * TOPK);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        st_release_gpu(flag, 1u);
    }
}

// ------------------------------------------------------------------ gate_up: shared expert item

// Rows n0..n0+7 of the shared gate and of the shared up (W4A16, w4a16_gemv's order), then the FP32
// silu-clamp input of the shared down for those 8 positions.
template <int H, int ISH>
__device__ __forceinline__ void moe_shared_gate_up(int n0, const __nv_bfloat16* x, const uint8_t* codes,
                                                   const uint8_t* scales, float sg, float limit, float* sh_x,
                                                   __nv_bfloat16* sgu) {
    __shared__ float wpart[4][W4A16_ROWS];
    __shared__ __nv_bfloat16 ybuf[16];  // [g n0..n0+7 | u n0..n0+7]
    const int grp = threadIdx.x >> 6, l = threadIdx.x & 63;
    const int row0 = (grp < 2 ? 0 : ISH) + n0 + 4 * (grp & 1);
    float acc[W4A16_ROWS];
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    if (w4a16_x_big<H>(x4))  // uniform over the CTA: the exact decode's wide-range fallback
        w4a16_rows_partial<H, true>(codes + (size_t)row0 * (H / 2), scales + (size_t)row0 * (H / 16), sg, x4, l,
                                    W4A16_ROWS, acc);
    else
        w4a16_rows_partial<H, false>(codes + (size_t)row0 * (H / 2), scales + (size_t)row0 * (H / 16), sg, x4, l,
                                     W4A16_ROWS, acc);
    w4a16_finish(acc, grp, l, W4A16_ROWS, ybuf + 4 * grp, wpart);
    __syncthreads();
    if (threadIdx.x < 8) {
        const float g = fminf(bf16_to_f32(ybuf[threadIdx.x]), limit);
        const float u = fminf(fmaxf(bf16_to_f32(ybuf[8 + threadIdx.x]), -limit), limit);
        sh_x[n0 + threadIdx.x] = __fmul_rn(silu_f32(g), u);
    }
    if (sgu != nullptr && threadIdx.x < 16)
        sgu[(threadIdx.x < 8 ? 0 : ISH - 8) + n0 + threadIdx.x] = ybuf[threadIdx.x];
    __syncthreads();  // ybuf / wpart are reused by the next item
}

// ------------------------------------------------------------------ gate_up: routed epilogue

// Warp 0 of the CTA completing tile t of slot s (lane r: gate row 16t + r, r < 16; up row
// I + 16t + r - 16): gate_up bytes, SwiGLU-clamp, and the down input's NVFP4 group t.
template <int I>
__device__ __forceinline__ void moe_gate_up_epilogue(float sum, float scale, float limit, float gamma_dn,
                                                     float inv_gdn, int s, int t, uint8_t* dn_codes,
                                                     uint8_t* dn_scales, __nv_bfloat16* egu) {
    const int r = threadIdx.x;
    const __nv_bfloat16 yb = f32_to_bf16(__fmul_rn(sum, scale));
    if (egu != nullptr) egu[(size_t)s * 2 * I + (r >> 4) * I + 16 * t + (r & 15)] = yb;
    const float g = bf16_to_f32(yb), u = __shfl_sync(0xffffffffu, g, (r & 15) + 16);
    const float h = round_bf16(swiglu_clamp_element(g, u, limit));  // lanes 0..15
    float m = r < 16 ? fabsf(h) : 0.0f;
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    const uint8_t sc = f32_to_e4m3(__fmul_rn(__fdiv_rn(m, 6.0f), inv_gdn));  // as nvfp4_quant_group
    const float sv = e4m3_to_f32(sc), denom = __fmul_rn(sv, gamma_dn);
    const uint32_t c = (r >= 16 || sv == 0.0f) ? 0u : f32_to_e2m1(__fdiv_rn(h, denom));
    uint32_t word = c << (4 * (r & 7));
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) word |= __shfl_xor_sync(0xffffffffu, word, off);
    const uint32_t hi = __shfl_sync(0xffffffffu, word, 8);
    if (r == 0) {
        *reinterpret_cast<uint2*>(dn_codes + (size_t)s * (I / 2) + 8 * t) = make_uint2(word, hi);
        dn_scales[(size_t)s * (I / 16) + t] = sc;
    }
}

// ------------------------------------------------------------------ the gate_up kernel

template <int H, int I, int ISH, int E, int TOPK, int M, int P, int STAGES>
__device__ __forceinline__ void moe_gate_up_dev(
    const __nv_bfloat16* xn, const __nv_bfloat16* w_router, const float* bias,
    float routed_scale, float gamma_gu, const uint8_t* gu_codes, const uint8_t* gu_scales,
    const float* gu_sg, float gamma_dn, float limit, const uint8_t* sh_codes,
    const uint8_t* sh_scales, float sh_sg, float* topk_w, int* topk_id, uint8_t* dn_codes,
    uint8_t* dn_scales, float* sh_x, float* logits, __nv_bfloat16* egu,
    __nv_bfloat16* sgu, const uint8_t* nx_codes, const uint8_t* nx_scales,
    int nx_rows) {
    using Sh = MoeGateUpShape<H, I, ISH, E, TOPK, M, P>;
    auto& st = moe_gate_up_state<H, I, ISH, E, TOPK, M, P>;
    extern __shared__ __align__(16) uint8_t moe_smem[];
    uint8_t* ring = moe_smem;
    MoeActGroup* act = reinterpret_cast<MoeActGroup*>(moe_smem + (size_t)STAGES * MOE_STAGE_BYTES);
    float* act_s = reinterpret_cast<float*>(act + M * Sh::NG);
    auto& ps = *reinterpret_cast<MoePipeSmem<STAGES>*>(moe_smem + moe_smem_bytes<STAGES>(M * Sh::NG) -
                                                        moe_align16(sizeof(MoePipeSmem<STAGES>)));
    __shared__ int claim_slot, last_flag;
    const int tid = threadIdx.x;
    moe_require_smem(moe_gate_up_smem<H, I, ISH, E, TOPK, M, P, STAGES>());

    // Before the dependency: weights only (the router's and the shared expert's, into L2).
    prefetch_l2_share(w_router, (size_t)E * H * 2);
    if (ISH > 0) {
        prefetch_l2_share(sh_codes, (size_t)2 * ISH * (H / 2));
        prefetch_l2_share(sh_scales, (size_t)2 * ISH * (H / 16));
    }
    pdl_wait();
    pdl_launch_dependents();

    float* lgt = logits != nullptr ? logits : st.logits;
    const float inv_gu = __fdiv_rn(1.0f, gamma_gu), inv_gdn = __fdiv_rn(1.0f, gamma_dn);
    for (;;) {  // 1. router units
        const int u = cta_claim(&st.claim_router, &claim_slot);
        if (u >= Sh::RU) break;
        moe_router_unit<H, E, TOPK, M, Sh::EB, Sh::QB>(u, xn, w_router, lgt, gamma_gu, inv_gu, st.xq_codes,
                                                      st.xq_scales);
        __syncthreads();
        if (tid == 0) {  // release the unit's logits / codes; the last unit's CTA acquires them all
            __threadfence();
            last_flag = atomicAdd(&st.router_done, 1u) == (unsigned)(Sh::RU - 1);
            __threadfence();
        }
        __syncthreads();
        if (last_flag) moe_router_topk<E, TOPK, M>(lgt, bias, routed_scale, topk_w, topk_id, &st.flag);
    }
    // 2. shared gate_up items fill the wait for the router (no new one once its flag is up); the
    //    ones left are taken after the routed items
    auto shared_items = [&](bool until_flag) {
        if constexpr (ISH > 0) {
            for (;;) {
                if (tid == 0)
                    claim_slot = until_flag && ld_acquire_gpu(&st.flag) != 0 ? Sh::SH : (int)atomicAdd(&st.claim_shared, 1u);
                __syncthreads();
                const int u = claim_slot;
                __syncthreads();
                if (u >= Sh::SH) break;
                const int t = u / (ISH / 8);
                moe_shared_gate_up<H, ISH>(8 * (u % (ISH / 8)), xn + (size_t)t * H, sh_codes, sh_scales, sh_sg, limit,
                                           sh_x + (size_t)t * ISH, sgu != nullptr ? sgu + (size_t)t * 2 * ISH : nullptr);
            }
        }
    };
    shared_items(true);
    cta_wait_flag(&st.flag);  // 3. routed items
    for (int t = 0; t < M; ++t)
        moe_stage_rows(reinterpret_cast<const uint8_t*>(st.xq_codes + t * Sh::NG), st.xq_scales + t * Sh::NG,
                       Sh::NG, act + t * Sh::NG, act_s + t * Sh::NG);
    __syncthreads();
    moe_routed_items<H, P, STAGES, Sh::S, Sh::T>(
        ring, ps, &st.claim_routed, topk_id, gu_codes, gu_scales, (size_t)2 * I, gu_sg, gamma_gu, act, act_s, st.gpart,
        st.cnt, [](int t, int r) { return (r >> 4) * I + 16 * t + (r & 15); }, [](int s) { return s / TOPK; },
        [&](int s, int t, float sum, float scale) {
            moe_gate_up_epilogue<I>(sum, scale, limit, gamma_dn, inv_gdn, s, t, dn_codes, dn_scales, egu);
        });
    shared_items(false);

    if (nx_rows > 0) {  // the down projection's first rows of every routed expert, into L2
        for (int s = 0; s < Sh::S; ++s) {
            const int e = __ldcg(topk_id + s);
            if (e < 0) continue;
            prefetch_l2_share(nx_codes + (size_t)e * H * (I / 2), (size_t)nx_rows * (I / 2));
            prefetch_l2_share(nx_scales + (size_t)e * H * (I / 16), (size_t)nx_rows * (I / 16));
        }
    }
    moe_leave(&st.exits, [&] {
        st.claim_router = st.router_done = st.claim_shared = st.claim_routed = st.flag = 0u;
        st.exits = 0u;
    });
}

// ------------------------------------------------------------------ the down kernel

// Warp 0 of the CTA completing (token t, rows n0..n0+31): the combine of moe_combine_body.
template <int H, int TOPK, bool SHARED>
__device__ __forceinline__ void moe_combine_rows(int t, int n0, const int* ids, const float* w,
                                                 const __nv_bfloat16* edown, const __nv_bfloat16* sdown,
                                                 __nv_bfloat16* y) {
    const int n = n0 + threadIdx.x;
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < TOPK; ++k) {
        const int s = t * TOPK + k;
        if (ld_step(ids + s) < 0) continue;
        const float e = __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(edown) + (size_t)s * H + n));
        acc = __fadd_rn(acc, __fmul_rn(ld_step(w + s), e));
    }
    if constexpr (SHARED) {
        const float sh = __ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(sdown) + (size_t)t * H + n));
        acc = __fadd_rn(acc, sh);
    }
    y[(size_t)t * H + n] = f32_to_bf16(acc);
}

template <int H, int I, int ISH, int TOPK, int M, int P, int STAGES>
__device__ __forceinline__ void moe_down_dev(
    const int* topk_id, const float* topk_w, const uint8_t* dn_codes,
    const uint8_t* dn_scales, float gamma_dn, const uint8_t* w_codes,
    const uint8_t* w_scales, const float* w_sg, const float* sh_x,
    const uint8_t* shd_codes, const uint8_t* shd_scales, float shd_sg,
    __nv_bfloat16* edown, __nv_bfloat16* sdown, __nv_bfloat16* y) {
    using Sh = MoeDownShape<H, I, ISH, TOPK, M, P>;
    auto& st = moe_down_state<H, I, ISH, TOPK, M, P>;
    extern __shared__ __align__(16) uint8_t moe_smem[];
    uint8_t* ring = moe_smem;
    MoeActGroup* act = reinterpret_cast<MoeActGroup*>(moe_smem + (size_t)STAGES * MOE_STAGE_BYTES);
    float* act_s = reinterpret_cast<float*>(act + Sh::S * Sh::NG);
    auto& ps = *reinterpret_cast<MoePipeSmem<STAGES>*>(moe_smem + moe_smem_bytes<STAGES>(Sh::S * Sh::NG) -
                                                        moe_align16(sizeof(MoePipeSmem<STAGES>)));
    __shared__ int claim_slot;
    __shared__ float wpart[4][W4A16_ROWS];
    const int tid = threadIdx.x;
    moe_require_smem(moe_down_smem<H, I, ISH, TOPK, M, P, STAGES>());
    auto arrive = [&](int t, int tile) {  // warp 0, after the tile's writes are fenced
        if (moe_warp_arrive(&st.cnt_tile[t * Sh::T + tile], Sh::TARGET))
            moe_combine_rows<H, TOPK, (ISH > 0)>(t, 32 * tile, topk_id, topk_w, edown, sdown, y);
    };

    if (ISH > 0) {
        prefetch_l2_share(shd_codes, (size_t)H * (ISH / 2));
        prefetch_l2_share(shd_scales, (size_t)H * (ISH / 16));
    }
    pdl_wait();
    pdl_launch_dependents();

    moe_stage_rows(dn_codes, dn_scales, Sh::S * Sh::NG, act, act_s);
    __syncthreads();
    // Shared down items (16 rows of token t): W4A16 work, ALU-bound, so only every
    // MOE_SHARED_EVERY-th CTA starts with them while the others stream routed weights; whoever
    // runs out of routed items takes the ones left.
    auto shared_items = [&] {
        if constexpr (ISH > 0) {
            for (;;) {
                const int u = cta_claim(&st.claim_shared, &claim_slot);
                if (u >= Sh::SH) break;
                const int t = u / (H / 16), n0 = 16 * (u % (H / 16));
                const int grp = tid >> 6, l = tid & 63, row0 = n0 + 4 * grp;
                float acc[W4A16_ROWS];
                w4a16_silu_rows<ISH>(shd_codes + (size_t)row0 * (ISH / 2), shd_scales + (size_t)row0 * (ISH / 16),
                                     shd_sg, sh_x + (size_t)t * ISH, l, W4A16_ROWS, acc);
                w4a16_finish(acc, grp, l, W4A16_ROWS, sdown + (size_t)t * H + row0, wpart);
                __syncthreads();  // the rows are written; warp 0's lane 0 releases them
                if (tid < 32) arrive(t, n0 / 32);
            }
        }
    };
    if (blockIdx.x % MOE_SHARED_EVERY == 0) shared_items();
    moe_routed_items<I, P, STAGES, Sh::S, Sh::T>(
        ring, ps, &st.claim_routed, topk_id, w_codes, w_scales, (size_t)H, w_sg, gamma_dn, act, act_s, st.gpart, st.cnt,
        [](int t, int r) { return 32 * t + r; }, [](int s) { return s; },
        [&](int s, int t, float sum, float scale) {
            edown[(size_t)s * H + 32 * t + threadIdx.x] = f32_to_bf16(__fmul_rn(sum, scale));
            arrive(s / TOPK, t);
        });
    shared_items();
    moe_leave(&st.exits, [&] { st.claim_shared = st.claim_routed = st.exits = 0u; });
}

// ------------------------------------------------------------------ the layer kernel

namespace {
// What phase 0 hands to phase 1 when the caller gives no buffer for it (inside a fused group these
// tensors have no arena buffer): the instance's own device memory.
template <int H, int I, int ISH, int E, int TOPK, int M>
struct MoeLayerScratch {
    float topk_w[M * TOPK];
    int topk_id[M * TOPK];
    uint2 dn_codes[M * TOPK * (I / 16)];
    uint8_t dn_scales[M * TOPK * (I / 16)];
    float sh_x[M * (ISH > 0 ? ISH : 1)];
    __nv_bfloat16 edown[M * TOPK * H];
    __nv_bfloat16 sdown[M * H];
};
template <int H, int I, int ISH, int E, int TOPK, int M>
__device__ MoeLayerScratch<H, I, ISH, E, TOPK, M> moe_layer_scratch;
}  // namespace

template <int H, int I, int ISH, int E, int TOPK, int M, int PG, int SG, int PD, int SD>
__global__ void __launch_bounds__(MOE_THREADS, 2) moe_layer(
    int phase, const __nv_bfloat16* xn, const __nv_bfloat16* w_router,
    const float* bias, float routed_scale, float gamma_gu, const uint8_t* gu_codes,
    const uint8_t* gu_scales, const float* gu_sg, float gamma_dn, float limit,
    const uint8_t* dn_codes_w, const uint8_t* dn_scales_w, const float* dn_sg,
    const uint8_t* sh_codes, const uint8_t* sh_scales, float sh_sg,
    const uint8_t* shd_codes, const uint8_t* shd_scales, float shd_sg,
    __nv_bfloat16* y, int prefetch_rows, float* logits, float* topk_w, int* topk_id,
    uint8_t* dn_codes, uint8_t* dn_scales, float* sh_x, __nv_bfloat16* egu, __nv_bfloat16* sgu,
    __nv_bfloat16* edown, __nv_bfloat16* sdown) {
    auto& sc = moe_layer_scratch<H, I, ISH, E, TOPK, M>;
    topk_w = topk_w != nullptr ? topk_w : sc.topk_w;
    topk_id = topk_id != nullptr ? topk_id : sc.topk_id;
    dn_codes = dn_codes != nullptr ? dn_codes : reinterpret_cast<uint8_t*>(sc.dn_codes);
    dn_scales = dn_scales != nullptr ? dn_scales : sc.dn_scales;
    sh_x = sh_x != nullptr ? sh_x : sc.sh_x;
    edown = edown != nullptr ? edown : sc.edown;
    sdown = sdown != nullptr ? sdown : sc.sdown;
    if (phase == 0)
        moe_gate_up_dev<H, I, ISH, E, TOPK, M, PG, SG>(xn, w_router, bias, routed_scale, gamma_gu, gu_codes, gu_scales,
                                                       gu_sg, gamma_dn, limit, sh_codes, sh_scales, sh_sg, topk_w,
                                                       topk_id, dn_codes, dn_scales, sh_x, logits, egu, sgu,
                                                       dn_codes_w, dn_scales_w, prefetch_rows);
    else
        moe_down_dev<H, I, ISH, TOPK, M, PD, SD>(topk_id, topk_w, dn_codes, dn_scales, gamma_dn, dn_codes_w,
                                                 dn_scales_w, dn_sg, sh_x, shd_codes, shd_scales, shd_sg, edown,
                                                 sdown, y);
}

}  // namespace kbp
