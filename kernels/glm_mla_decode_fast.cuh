// glm_mla_decode_fast.cuh: the `fast`-numerics form of the sparse MLA decode (family
// glm_mla_decode; the exact form and its order are kernels/glm_mla_decode.cuh). The attended
// entries are dealt to S slices; a CTA computes one slice's partial softmax state for HPC heads in
// FP32 with its own accumulation order; once the S CTAs of a head group have published their
// partials (an arrival barrier), each merges a share of the group's outputs, the S partials in slice
// order, so the bits do not depend on which CTA merges what (every output's arithmetic is fixed).
//
// Launch contract
//   glm_mla_decode_fast<E, HPC><<<dim3(S, H / HPC, rows), MLA_FAST_THREADS,
//                                 mla_fast_smem_bytes(E, HPC, chunk, S)>>>(
//       q, cache, block_table, page_size, sel, width, seq_len, s_k, chunk, out, partials, counters)
//   q, cache, block_table, page_size, sel, width, seq_len, s_k, out: as glm_mla_decode_split
//   chunk        entries staged per round trip of a CTA, 1 .. MLA_FAST_THREADS
//   partials     float [rows][S][H][E + 4]   per slice and head: o (E), m, l, 2 pad (scratch)
//   counters     uint32_t [rows][H / HPC][2] arrive and depart counts per head group; zero at
//                                            launch, left zero
//   E a multiple of 512; HPC in {1, 2, 4}; H a multiple of HPC.
//   glm_mla_decode_fast_quant<E, HPC>(same arguments..., codes, scales, sync)   (fusion rule
//   mla_attend_quant) also quantizes each output row to per-token FP8 as w8a8_act_quant_row<H*E>
//   would (the same bytes): codes uint8 [rows][H*E], scales float [rows], sync uint32
//   [rows][S*H/HPC + 2] (an amax slot per CTA of the row, then arrive and depart counts; zero at
//   launch, the counts left zero). `out` (BF16, the bits the unfused form writes) may be nullptr.
//
// Math (explain.families.glm_mla_decode) in this form's order; slice s takes selection entries
// s, s + S, s + 2S, ... (strided, so skipped tails spread over all slices), `chunk` at a time:
// - the chunk's valid entries (-1 and ids outside [0, seq_len) skipped, duplicates kept) are
//   compacted in list order and their latent rows staged with cp.async, ROUND rows per commit
//   group, so the dots of a round start while the later rounds are in flight;
// - per row j and head h: d = sum_c q_c c^_c over the E4M3 codes c^ (exact in FP32), lane l FMAs
//   channels 16(l + 32i) + k in order from its first product, a transposed xor butterfly;
//   z = fl(fl(d s_k) fl(1/sqrtf(E)));
// - per head: m' = max(m, max_j z_j), a = exp(m - m') (0 while m = -inf), p_j = exp(z_j - m'),
//   l = fl(l a) + (lane-strided sequential sums of p_j, xor butterfly), o_c = fl(o_c a), then
//   o_c = fma(p_j, c^_jc, o_c) over the chunk's rows in order (thread t owns channels CPT t ..);
// - merge (output i of a head group by CTA i / mla_fast_share): M = max_s m_s, f_s = exp(m_s - M)
//   (0 for an empty slice), L = sum_s fl(l_s f_s), O_c = sum_s fl(o_sc f_s) in slice order;
//   out = rn_bf16(fl(fl(O_c s_k) / L)), zeros when L = 0 (no valid entry).
// Quantizer (the fused form): each CTA takes the max |y| of its share's BF16 outputs, publishes it
// in its slot and arrives; once all S * H / HPC CTAs of the row have arrived, each takes the row's
// max over the slots (order-free), s = fp8_scale(max), and encodes its share (sat_e4m3(clamp(y /
// s)), w8a8_act_quant.cuh's expression); CTA 0 stores s. Both barriers spin: all of the grid's
// CTAs are resident together, since dependents launch only once every CTA has started and nothing
// else waits for this grid, so none waits for an SM a spinner holds; a lost arrival traps.
// exp is kbp::exp_f32, the exact form's. The bound against the reference, per output, is
// kbpc/reference/glm_mla_decode_fast.py (fast_bound), tested in tests/gpu/test_gpu_mla_decode_fast.py.
// PDL: every step input is read after pdl_wait() through ld_step or cp.async.cg (L2); dependents are
// released right after the wait (they launch only once every CTA of this grid has started). At the
// seed's shape a CTA holds 174 registers a thread, so the DSA output projection's CTAs (128) find
// room only as the decode's CTAs exit; capped at 128 (two CTAs an SM) they loaded their weights
// during the decode, which then took 2-3 us longer: DSA sublayer -1.0 us at 1k, +0.2 to +1.0 at 16k
// against this form (H200, 128-expert seed shrink, replay timelines; bench/NOTES.md, 29th session).
// Both kernels carry phase stamps (kbp_stamps.cuh): 3 attended, 4 partials published, 5 merge factors, 6 row scale.
#pragma once

#include "dsa_indexer_common.cuh"   // transpose_reduce
#include "glm_mla_decode.cuh"       // mla_codes2, MlaFactors
#include "kbp_common.cuh"
#include "w8a8_act_quant.cuh"       // fp8_scale, fp8_code

namespace kbp {

constexpr int MLA_FAST_THREADS = 256;
constexpr int MLA_FAST_WARPS = MLA_FAST_THREADS / 32;

// Dynamic shared memory: staged rows (chunk x E bytes), z then p per row and head, the compacted
// cache rows, the merge's factors and products per head and slice, and the CTA's merged outputs
// (BF16 bits, for the fused quantizer).
// Outputs of its head group's HPC E that each of the S CTAs merges (a multiple of 8).
__host__ __device__ constexpr int mla_fast_share(int e, int hpc, int slices) {
    return ((hpc * e + slices - 1) / slices + 7) / 8 * 8;
}
__host__ __device__ constexpr size_t mla_fast_smem_bytes(int e, int hpc, int chunk, int slices) {
    return (size_t)chunk * (e + 4 * hpc + 4) + (size_t)8 * hpc * slices + (size_t)2 * mla_fast_share(e, hpc, slices);
}

// 16 E4M3 codes (one uint4) -> their exact FP32 values.
__device__ __forceinline__ void mla_codes16(const uint4 raw, float (&v)[16]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 lo = mla_codes2(w[i]), hi = mla_codes2(w[i] >> 16);
        v[4 * i] = lo.x; v[4 * i + 1] = lo.y; v[4 * i + 2] = hi.x; v[4 * i + 3] = hi.y;
    }
}

// Wait until at most `pending` commit groups are in flight (at most 3 are ever left in flight:
// waiting for more than asked is correct, only later).
__device__ __forceinline__ void mla_fast_wait(int pending) {
    if (pending >= 3) cp_async_wait<3>();
    else if (pending == 2) cp_async_wait<2>();
    else if (pending == 1) cp_async_wait<1>();
    else cp_async_wait<0>();
}

// Dots of rows j0 .. j0 + 32/HPC - 1 (< n) for the CTA's heads, by one warp: z into zp[j].h[head].
template <int E, int HPC>
__device__ __forceinline__ void mla_fast_dots(const uint8_t* lat, MlaFactors<HPC>* zp, int n, int j0,
                                              const float (&qf)[HPC][E / 512][16], float s_k, float scale) {
    constexpr int CH = E / 512, R = 32 / HPC;
    const int lane = threadIdx.x & 31;
    if (j0 >= n) return;   // warp-uniform
    float part[32];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        if (j0 + i < n) {   // warp-uniform
#pragma unroll
            for (int ch = 0; ch < CH; ++ch) {
                float v[16];
                mla_codes16(*reinterpret_cast<const uint4*>(lat + (size_t)(j0 + i) * E + 16 * (lane + 32 * ch)), v);
#pragma unroll
                for (int h = 0; h < HPC; ++h)
#pragma unroll
                    for (int k = 0; k < 16; ++k)
                        part[i * HPC + h] = __fmaf_rn(qf[h][ch][k], v[k], ch == 0 && k == 0 ? 0.0f : part[i * HPC + h]);
            }
        } else {
#pragma unroll
            for (int h = 0; h < HPC; ++h) part[i * HPC + h] = 0.0f;
        }
    }
    const float dot = transpose_reduce<32>(part, lane);   // lane l: slot l = (row l / HPC, head l % HPC)
    const int j = j0 + lane / HPC;
    if (j < n) zp[j].h[lane % HPC] = (dot * s_k) * scale;
}

// CPT consecutive E4M3 codes from shared memory (CPT even, 2-byte aligned) -> exact FP32 values.
template <int CPT>
__device__ __forceinline__ void mla_codes_n(const uint8_t* p, float (&v)[CPT]) {
#pragma unroll
    for (int i = 0; i < CPT; i += 2) {
        const float2 f = mla_codes2(*reinterpret_cast<const uint16_t*>(p + i));
        v[i] = f.x;
        v[i + 1] = f.y;
    }
}

// The merge, spread over the head group's S CTAs: once all S have published (an arrival barrier
// per head group), CTA s merges the group's outputs [s P, s P + P) (mla_fast_share: P = HPC E / S
// rounded up to 8), each output by one thread: its S partial values loaded mla_share_batch at a
// time, summed in slice order. Warps W-1-h (the warps that hold no output at the seed's shape) form
// head h's factors beside those loads: M = max_s m_s, f_s = exp(m_s - M) (0 for an empty slice),
// L = sum_s fl(l_s f_s) in slice order. The operations and their order per output are the
// single-CTA merge's, so the bits do not depend on which CTA merges. (Before, the group's last CTA
// merged all of its outputs: 128 partial values a thread at the seed's shape, in four dependent L2
// round trips.)
// Slices a thread loads at once: 16 (one batch at the seed's 16 slices); 8 for HPC 2, which ptxas
// holds at 128 registers and which spilled 40 bytes at 16.
__host__ __device__ constexpr int mla_share_batch(int hpc) { return hpc == 2 ? 8 : 16; }

// Loads slices u0 .. u0 + B - 1 (< slices) of one output (o at offset `off` of a slice's partial
// block; a row's partials span far less than 2^31 floats).
template <int B>
__device__ __forceinline__ void mla_share_load(const float* part, size_t off, int u0, int slices,
                                               size_t slice_stride, float (&x)[B]) {
    const float* p = part + (size_t)u0 * slice_stride + off;
    const int n = slices - u0;
#pragma unroll
    for (int b = 0; b < B; ++b) x[b] = b < n ? __ldcg(p + b * (int)slice_stride) : 0.0f;
}

// Head h's factors, by warp W-1-h (called by warps W-HPC .. W-1 only): fmerge[h][s] = f_s and
// l_sh[h] = L (ml: [HPC][S] scratch).
template <int E, int HPC>
__device__ __forceinline__ void mla_fast_factors(const float* part, int slices, size_t slice_stride,
                                                 float* fmerge, float* ml, float* l_sh) {
    constexpr size_t PS = E + 4;
    const int lane = threadIdx.x & 31, h = MLA_FAST_WARPS - 1 - (threadIdx.x >> 5);   // < HPC
    float m = -INFINITY;
    for (int u = lane; u < slices; u += 32) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(part + (size_t)u * slice_stride + h * PS + E));
        fmerge[h * slices + u] = v.x;
        ml[h * slices + u] = v.y;
        m = fmaxf(m, v.x);
    }
    m = warp_max_xor(m);   // max is order-free
    for (int u = lane; u < slices; u += 32) {
        const float mu = fmerge[h * slices + u];
        const float f = mu == -INFINITY ? 0.0f : exp_f32(mu - m);
        fmerge[h * slices + u] = f;
        ml[h * slices + u] = ml[h * slices + u] * f;
    }
    __syncwarp();
    if (lane == 0) {
        float l = 0.0f;
        for (int u = 0; u < slices; ++u) l = l + ml[h * slices + u];
        l_sh[h] = l;
    }
}

// This CTA's share of the head group's merge (see above): outputs [lo, hi) of the group's HPC E,
// written to dst (BF16, may be nullptr) and, for the fused quantizer (QUANT), as BF16 bits to
// ys[i - lo]; then returns the largest |y| of the thread's outputs.
template <int E, int HPC, bool QUANT>
__device__ __forceinline__ float mla_fast_merge_share(const float* part, int slices, size_t slice_stride,
                                                      float s_k, int lo, int hi, float* fmerge, float* ml,
                                                      float* l_sh, __nv_bfloat16* dst, uint16_t* ys) {
    constexpr size_t PS = E + 4;
    constexpr int B = mla_share_batch(HPC);
    const int t = threadIdx.x;
    // The factor warps form the factors while the others load their first output's first batch.
    const bool factors = MLA_FAST_WARPS - 1 - (t >> 5) < HPC, early = !factors && lo + t < hi;
    float x[B];
    if (factors)
        mla_fast_factors<E, HPC>(part, slices, slice_stride, fmerge, ml, l_sh);
    else if (early)
        mla_share_load(part, ((lo + t) / E) * PS + (lo + t) % E, 0, slices, slice_stride, x);
    __syncthreads();   // fmerge, l_sh
    KBP_STAMP(5);   // merge factors formed (and the first output's first batch loaded)
    float amax = 0.0f;
    for (int i = lo + t; i < hi; i += MLA_FAST_THREADS) {
        const int h = i / E;
        const size_t off = (size_t)h * PS + i % E;
        float acc = 0.0f;
        for (int u0 = 0; u0 < slices; u0 += B) {
            if (u0 > 0 || i != lo + t || !early) mla_share_load(part, off, u0, slices, slice_stride, x);
#pragma unroll
            for (int b = 0; b < B; ++b)
                if (u0 + b < slices) acc = acc + x[b] * fmerge[h * slices + u0 + b];
        }
        const float l = l_sh[h];
        const __nv_bfloat16 y = f32_to_bf16(l > 0.0f ? (acc * s_k) / l : 0.0f);
        if (dst != nullptr) dst[i] = y;
        if constexpr (QUANT) {
            ys[i - lo] = __bfloat16_as_ushort(y);
            amax = fmaxf(amax, fabsf(bf16_to_f32(y)));
        }
    }
    return amax;
}

// Where the fused quantizer writes (see the launch contract).
struct MlaQuantOut {
    uint8_t* codes;    // [rows][H*E]
    float* scales;     // [rows]
    uint32_t* sync;    // [rows][ctas + 2]: an amax slot per CTA of the row, then arrive and depart
};

// The row's per-token FP8 scale from every CTA's max (all S * G CTAs of row r), then this CTA's
// codes: outputs [lo, hi) of head group hg, their BF16 bits in ys.
template <int E, int HPC>
__device__ __forceinline__ void mla_fast_quant(float amax, const uint16_t* ys, int lo, int hi, int hg, int cta,
                                               int ctas, int r, const MlaQuantOut& qo) {
    __shared__ float red[MLA_FAST_WARPS];
    __shared__ float scale_sh;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    uint32_t* sync = qo.sync + (size_t)r * (ctas + 2);
    float* slots = reinterpret_cast<float*>(sync);
    amax = warp_max_xor(amax);
    if (lane == 0) red[warp] = amax;
    __syncthreads();
    if (t == 0) {
        float cm = red[0];
#pragma unroll
        for (int w = 1; w < MLA_FAST_WARPS; ++w) cm = fmaxf(cm, red[w]);
        __stcg(slots + cta, cm);
    }
    mla_barrier(sync + ctas, sync + ctas + 1, (uint32_t)ctas);
    KBP_STAMP(6);   // fused form: every CTA of the row merged and arrived (before the row's scale)
    if (warp == 0) {   // the row's max over the slots (order-free)
        float g = 0.0f;
        for (int i = lane; i < ctas; i += 32) g = fmaxf(g, __ldcg(slots + i));
        g = warp_max_xor(g);
        if (lane == 0) scale_sh = fp8_scale(g);
    }
    __syncthreads();
    const float s = scale_sh;
    uint8_t* dst = qo.codes + ((size_t)r * gridDim.y + hg) * HPC * E;
    for (int i = lo + t; i < hi; i += MLA_FAST_THREADS) {
        const float y = bf16_to_f32(__ushort_as_bfloat16(ys[i - lo]));
        dst[i] = (uint8_t)fp8_code(y, s);
    }
    if (cta == 0 && t == 0) qo.scales[r] = s;
}

template <int E, int HPC, bool QUANT = false>
__device__ __forceinline__ void glm_mla_decode_fast_body(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, int chunk, __nv_bfloat16* out,
    float* partials, uint32_t* counters, MlaQuantOut qo = MlaQuantOut{}) {
    static_assert(E % 512 == 0, "a lane owns 16-byte chunks of 16 channels");
    static_assert(HPC == 1 || HPC == 2 || HPC == 4, "32 / HPC rows per transposed butterfly");
    constexpr int CH = E / 512, CPT = E / MLA_FAST_THREADS, R = 32 / HPC, PIECES = E / 16;
    constexpr int ROUND = MLA_FAST_WARPS * R;   // rows per commit group: one dot batch per warp
    constexpr size_t PS = E + 4;
    extern __shared__ __align__(16) uint8_t mla_fast_dyn[];
    __shared__ int warp_count[MLA_FAST_WARPS];
    __shared__ float fa[HPC], l_sh[HPC];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int s = blockIdx.x, slices = gridDim.x, hg = blockIdx.y, groups = gridDim.y, r = blockIdx.z;
    const int H = groups * HPC;
    uint8_t* lat = mla_fast_dyn;
    MlaFactors<HPC>* zp = reinterpret_cast<MlaFactors<HPC>*>(mla_fast_dyn + (size_t)chunk * E);
    int* rows = reinterpret_cast<int*>(mla_fast_dyn + (size_t)chunk * (E + 4 * HPC));
    float* fmerge = reinterpret_cast<float*>(rows + chunk);   // [HPC][S]
    float* merge_ml = fmerge + HPC * gridDim.x;                // [HPC][S]: l f per slice

    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // q, sel, this step's cache row and seq_len: written by earlier kernels
    KBP_STAMP(kStampWaitOut);
    ::kbp::pdl_launch_dependents();
    const int seq_len = ld_step(seq_len_ptr);
    sel += (size_t)r * width;
    const int mine = s < width ? (width - s + slices - 1) / slices : 0;   // entries s, s + S, ...

    float qf[HPC][CH][16];
    mla_load_queries<E, HPC>(q + ((size_t)r * H + hg * HPC) * E, lane, qf);
    const float scale = 1.0f / sqrtf((float)E);
    float o[HPC][CPT];
    mla_zero(o);
    float m_run = -INFINITY, l_run = 0.0f;   // warps h < HPC: head h

    for (int base = 0; base < mine; base += chunk) {
        // Compact the chunk's valid entries in list order (thread t: entry base + t).
        int row = -1;
        if (t < min(chunk, mine - base)) {
            const int id = ld_step(sel + s + (size_t)(base + t) * slices);
            if (id >= 0 && id < seq_len) row = ld_step(block_table + id / page_size) * page_size + id % page_size;
        }
        const unsigned ball = __ballot_sync(0xffffffffu, row >= 0);
        if (lane == 0) warp_count[warp] = __popc(ball);
        __syncthreads();
        int pos = __popc(ball & ((1u << lane) - 1u)), n = 0;
#pragma unroll
        for (int w = 0; w < MLA_FAST_WARPS; ++w) {
            pos += w < warp ? warp_count[w] : 0;
            n += warp_count[w];
        }
        if (row >= 0) rows[pos] = row;
        __syncthreads();

        const int rounds = (n + ROUND - 1) / ROUND;
        for (int rd = 0; rd < rounds; ++rd) {
            const int r0 = rd * ROUND, rn = min(ROUND, n - r0);
            for (int i = t; i < rn * PIECES; i += MLA_FAST_THREADS) {
                const int j = r0 + i / PIECES, off = 16 * (i % PIECES);
                cp_async16(lat + (size_t)j * E + off, cache + (size_t)rows[j] * E + off);
            }
            cp_async_commit();
        }
        for (int rd = 0; rd < rounds; ++rd) {
            mla_fast_wait(rounds - 1 - rd);
            __syncthreads();   // every thread's copies of the round have landed
            mla_fast_dots<E, HPC>(lat, zp, n, rd * ROUND + warp * R, qf, s_k, scale);
        }
        __syncthreads();

        if (warp < HPC) {   // softmax factors of head `warp`
            float cmax = -INFINITY;
            for (int j = lane; j < n; j += 32) cmax = fmaxf(cmax, zp[j].h[warp]);
            const float m_new = fmaxf(m_run, warp_max_xor(cmax));
            const float a = m_run == -INFINITY ? 0.0f : exp_f32(m_run - m_new);
            float lsum = 0.0f;
            for (int j = lane; j < n; j += 32) {
                const float p = exp_f32(zp[j].h[warp] - m_new);
                zp[j].h[warp] = p;
                lsum = lsum + p;
            }
            l_run = l_run * a + warp_sum_xor(lsum);
            m_run = m_new;
            if (lane == 0) fa[warp] = a;
        }
        __syncthreads();

#pragma unroll
        for (int h = 0; h < HPC; ++h)
#pragma unroll
            for (int c = 0; c < CPT; ++c) o[h][c] = o[h][c] * fa[h];
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
            float v[CPT];
            mla_codes_n<CPT>(lat + (size_t)j * E + t * CPT, v);
            const MlaFactors<HPC> p = mla_load_factors(zp[j]);
#pragma unroll
            for (int h = 0; h < HPC; ++h)
#pragma unroll
                for (int c = 0; c < CPT; ++c) o[h][c] = __fmaf_rn(p.h[h], v[c], o[h][c]);
        }
        __syncthreads();   // the chunk's rows, factors and row list are rewritten next
    }

    KBP_STAMP(3);   // attend phase done (the slice's partial state in registers)
    // Publish this slice's partial; once the head group's S CTAs have, each merges its share.
    float* mine_p = partials + (((size_t)r * slices + s) * H + hg * HPC) * PS;
#pragma unroll
    for (int h = 0; h < HPC; ++h)
#pragma unroll
        for (int c = 0; c < CPT; c += 2)
            __stcg(reinterpret_cast<float2*>(mine_p + h * PS + t * CPT + c), make_float2(o[h][c], o[h][c + 1]));
    if (warp < HPC && lane == 0) {
        __stcg(mine_p + warp * PS + E, m_run);
        __stcg(mine_p + warp * PS + E + 1, l_run);
    }
    uint32_t* cnt = counters + 2 * ((size_t)r * groups + hg);
    mla_barrier(cnt, cnt + 1, (uint32_t)slices);   // glm_mla_decode.cuh
    KBP_STAMP(4);   // the head group's S partials published (arrival barrier passed)
    const int share = mla_fast_share(E, HPC, slices);
    const int lo = min(HPC * E, s * share), hi = min(HPC * E, lo + share);
    uint16_t* ys = reinterpret_cast<uint16_t*>(merge_ml + HPC * slices);
    const float amax = mla_fast_merge_share<E, HPC, QUANT>(
        partials + ((size_t)r * slices * H + hg * HPC) * PS, slices, (size_t)H * PS, s_k, lo, hi, fmerge, merge_ml,
        l_sh, out == nullptr ? nullptr : out + ((size_t)r * H + hg * HPC) * E, ys);
    if constexpr (QUANT) mla_fast_quant<E, HPC>(amax, ys, lo, hi, hg, hg * slices + s, slices * groups, r, qo);
}

template <int E, int HPC>
__global__ void __launch_bounds__(MLA_FAST_THREADS) glm_mla_decode_fast(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, int chunk, __nv_bfloat16* out,
    float* partials, uint32_t* counters) {
    KBP_STAMP_BEGIN();
    glm_mla_decode_fast_body<E, HPC>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, chunk, out,
                                     partials, counters);
    KBP_STAMP_END();
}

template <int E, int HPC>
__global__ void __launch_bounds__(MLA_FAST_THREADS) glm_mla_decode_fast_quant(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, int chunk, __nv_bfloat16* out,
    float* partials, uint32_t* counters, uint8_t* codes, float* scales, uint32_t* sync) {
    KBP_STAMP_BEGIN();
    glm_mla_decode_fast_body<E, HPC, true>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, chunk,
                                           out, partials, counters, MlaQuantOut{codes, scales, sync});
    KBP_STAMP_END();
}

}  // namespace kbp
