// glm_mla_decode_fast.cuh: the `fast`-numerics form of the sparse MLA decode (family
// glm_mla_decode; the exact form and its order are kernels/glm_mla_decode.cuh). The attended
// entries are dealt to S slices; a CTA computes one slice's partial softmax state for HPC heads in
// FP32 with its own accumulation order, and the last-arriving CTA of each head group merges the S
// partials in slice order: one cross-CTA round trip, and the bits do not depend on which CTA
// finishes last (every CTA's arithmetic is fixed, the merge order too).
//
// Launch contract
//   glm_mla_decode_fast<E, HPC><<<dim3(S, H / HPC, rows), MLA_FAST_THREADS,
//                                 mla_fast_smem_bytes(E, HPC, chunk, S)>>>(
//       q, cache, block_table, page_size, sel, width, seq_len, s_k, chunk, out, partials, counters)
//   q, cache, block_table, page_size, sel, width, seq_len, s_k, out: as glm_mla_decode_split
//   chunk        entries staged per round trip of a CTA, 1 .. MLA_FAST_THREADS
//   partials     float [rows][S][H][E + 4]   per slice and head: o (E), m, l, 2 pad (scratch)
//   counters     uint32_t [rows][H / HPC]    arrivals per head group; zero at launch, left zero
//   E a multiple of 512; HPC in {1, 2, 4}; H a multiple of HPC.
//   glm_mla_decode_fast_quant<E, HPC>(same arguments..., codes, scales, sync)   (fusion rule
//   mla_attend_quant) also quantizes each output row to per-token FP8 as w8a8_act_quant_row<H*E>
//   would (the same bytes): codes uint8 [rows][H*E], scales float [rows], sync uint32
//   [rows][H/HPC + 2] (per head group one amax slot, then arrive and depart counts; zero at launch,
//   the counts left zero). `out` (BF16, the bits the unfused form writes) may be nullptr here.
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
// - merge (last CTA of the head group): M = max_s m_s, f_s = exp(m_s - M) (0 for an empty slice),
//   L = sum_s fl(l_s f_s), O_c = sum_s fl(o_sc f_s) in slice order; out = rn_bf16(fl(fl(O_c s_k) / L)),
//   zeros when L = 0 (no valid entry).
// Quantizer (the fused form): each head group's merging CTA takes the max |y| of its BF16 outputs,
// publishes it in its slot and arrives; once every group has arrived (a spin: every merging CTA is
// resident, being the last running CTA of its group, and the grid's other CTAs have all started
// before any dependent may launch, so none waits for an SM a spinner holds) each takes the row's
// max over the slots (order-free), s = fp8_scale(max), and encodes its own outputs
// (sat_e4m3(clamp(y / s)), w8a8_act_quant.cuh's expression); group 0 stores s. The last CTA to
// depart zeroes the counts. Each CTA encodes HPC * E values, 8 a thread at the seed's shape,
// instead of a quantizer launch after the decode's grid.
// exp is kbp::exp_f32, the exact form's. The bound against the reference, per output, is
// kbpc/reference/glm_mla_decode_fast.py (fast_bound), tested in tests/gpu/test_gpu_mla_decode_fast.py.
// PDL: every step input is read after pdl_wait() through ld_step or cp.async.cg (L2); dependents are
// released right after the wait (they launch only once every CTA of this grid has started).
#pragma once

#include "dsa_indexer_common.cuh"   // transpose_reduce
#include "glm_mla_decode.cuh"       // mla_codes2, MlaFactors
#include "kbp_common.cuh"
#include "w8a8_act_quant.cuh"       // fp8_scale

namespace kbp {

constexpr int MLA_FAST_THREADS = 256;
constexpr int MLA_FAST_WARPS = MLA_FAST_THREADS / 32;

// Dynamic shared memory: staged rows (chunk x E bytes), z then p per row and head, the compacted
// cache rows, and the merge's factors, m and l per head and slice.
__host__ __device__ constexpr size_t mla_fast_smem_bytes(int e, int hpc, int chunk, int slices) {
    return (size_t)chunk * (e + 4 * hpc + 4) + (size_t)12 * hpc * slices;
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

// The last CTA of a head group: merge the S partials in slice order and write the output (its
// values, as the BF16 stored, also in y). Every partial is read once, in as few dependent L2 round
// trips as the registers allow: each (head, slice) pair's m and l by one thread into `ml` (2 HPC S
// floats of shared memory), and each thread's o
// values MERGE_BATCH slices at a time, the next batch's loads issued before the current one is
// summed; the first batch goes out before the barriers that form M, the factors and L. The sums
// are the ones below in slice order, so the bits do not depend on how the loads are scheduled.
constexpr int MLA_MERGE_BATCH = 4;

template <int E, int HPC>
__device__ __forceinline__ void mla_fast_merge_load(const float* part, int u0, int slices, size_t slice_stride,
                                                    float2 (&x)[MLA_MERGE_BATCH][HPC][E / MLA_FAST_THREADS / 2]) {
    constexpr int CPT = E / MLA_FAST_THREADS;
    constexpr size_t PS = E + 4;
#pragma unroll
    for (int b = 0; b < MLA_MERGE_BATCH; ++b)
#pragma unroll
        for (int h = 0; h < HPC; ++h)
#pragma unroll
            for (int c = 0; c < CPT; c += 2)
                x[b][h][c / 2] = u0 + b < slices
                    ? __ldcg(reinterpret_cast<const float2*>(part + (u0 + b) * slice_stride + h * PS +
                                                             threadIdx.x * CPT + c))
                    : make_float2(0.0f, 0.0f);
}

template <int E, int HPC>
__device__ __forceinline__ void mla_fast_merge(const float* part, int slices, size_t slice_stride, float s_k,
                                               float* fmerge, float* ml, float* m_sh, float* l_sh,
                                               __nv_bfloat16* dst, float (&y)[HPC][E / MLA_FAST_THREADS]) {
    constexpr int CPT = E / MLA_FAST_THREADS, B = MLA_MERGE_BATCH;
    constexpr size_t PS = E + 4;
    const int t = threadIdx.x, pairs = HPC * slices;
    for (int i = t; i < pairs; i += MLA_FAST_THREADS) {   // pair i: head i / slices, slice i % slices
        const float2 v = __ldcg(reinterpret_cast<const float2*>(part + (i % slices) * slice_stride +
                                                                (i / slices) * PS + E));
        ml[i] = v.x;
        ml[pairs + i] = v.y;
    }
    float2 x[B][HPC][CPT / 2];
    mla_fast_merge_load<E, HPC>(part, 0, slices, slice_stride, x);
    __syncthreads();
    if (t < HPC) {
        float m = -INFINITY;
        for (int u = 0; u < slices; ++u) m = fmaxf(m, ml[t * slices + u]);
        m_sh[t] = m;
    }
    __syncthreads();
    for (int i = t; i < pairs; i += MLA_FAST_THREADS) {
        const float m = ml[i];
        fmerge[i] = m == -INFINITY ? 0.0f : exp_f32(m - m_sh[i / slices]);
    }
    __syncthreads();
    if (t < HPC) {
        float l = 0.0f;
        for (int u = 0; u < slices; ++u) l = l + ml[pairs + t * slices + u] * fmerge[t * slices + u];
        l_sh[t] = l;
    }
    float acc[HPC][CPT];
    mla_zero(acc);
    for (int u0 = 0; u0 < slices; u0 += B) {
        float2 cur[B][HPC][CPT / 2];
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
            for (int h = 0; h < HPC; ++h)
#pragma unroll
                for (int c = 0; c < CPT / 2; ++c) cur[b][h][c] = x[b][h][c];
        if (u0 + B < slices) mla_fast_merge_load<E, HPC>(part, u0 + B, slices, slice_stride, x);
#pragma unroll
        for (int b = 0; b < B; ++b) {
            if (u0 + b >= slices) break;
#pragma unroll
            for (int h = 0; h < HPC; ++h) {
                const float f = fmerge[h * slices + u0 + b];
#pragma unroll
                for (int c = 0; c < CPT; c += 2) {
                    acc[h][c] = acc[h][c] + cur[b][h][c / 2].x * f;
                    acc[h][c + 1] = acc[h][c + 1] + cur[b][h][c / 2].y * f;
                }
            }
        }
    }
    __syncthreads();   // l_sh
#pragma unroll
    for (int h = 0; h < HPC; ++h) {
        const float l = l_sh[h];
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            const __nv_bfloat16 b = f32_to_bf16(l > 0.0f ? (acc[h][c] * s_k) / l : 0.0f);
            if (dst != nullptr) dst[(size_t)h * E + t * CPT + c] = b;
            y[h][c] = bf16_to_f32(b);
        }
    }
}

// Where the fused quantizer writes (see the launch contract).
struct MlaQuantOut {
    uint8_t* codes;    // [rows][H*E]
    float* scales;     // [rows]
    uint32_t* sync;    // [rows][groups + 2]
};

constexpr long long kMlaSpinLimit = 1LL << 24;   // polls (~5 s) before a lost arrival traps

__device__ __forceinline__ uint32_t mla_load_acquire(const uint32_t* p) { return ld_acquire_gpu(p); }

// The merging CTA of head group hg of row r: the row's per-token FP8 scale from every group's max,
// then this group's codes (heads hg*HPC.., y from mla_fast_merge).
template <int E, int HPC>
__device__ __forceinline__ void mla_fast_quant(const float (&y)[HPC][E / MLA_FAST_THREADS], int hg, int groups,
                                               int r, const MlaQuantOut& qo) {
    constexpr int CPT = E / MLA_FAST_THREADS;
    static_assert(CPT % 2 == 0, "codes stored in pairs");
    __shared__ float red[MLA_FAST_WARPS];
    __shared__ float scale_sh;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    float m = 0.0f;
#pragma unroll
    for (int h = 0; h < HPC; ++h)
#pragma unroll
        for (int c = 0; c < CPT; ++c) m = fmaxf(m, fabsf(y[h][c]));
    m = warp_max_xor(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (t == 0) {
        uint32_t* sync = qo.sync + (size_t)r * (groups + 2);
        float* slots = reinterpret_cast<float*>(sync);
        float cm = red[0];
#pragma unroll
        for (int w = 1; w < MLA_FAST_WARPS; ++w) cm = fmaxf(cm, red[w]);
        __stcg(slots + hg, cm);
        __threadfence();
        atomicAdd(sync + groups, 1u);
        for (long long n = 0; mla_load_acquire(sync + groups) < (uint32_t)groups; ++n)
            if (n > kMlaSpinLimit) __trap();   // a group never arrived: a bug, never a hang
        float g = 0.0f;
        for (int i = 0; i < groups; ++i) g = fmaxf(g, __ldcg(slots + i));
        scale_sh = fp8_scale(g);
        if (atomicAdd(sync + groups + 1, 1u) == (uint32_t)groups - 1) {   // every group is past its spin
            sync[groups] = 0u;
            sync[groups + 1] = 0u;
        }
    }
    __syncthreads();
    const float s = scale_sh;
    const size_t H = (size_t)groups * HPC;
#pragma unroll
    for (int h = 0; h < HPC; ++h) {
        uint8_t* dst = qo.codes + ((size_t)r * H + (size_t)hg * HPC + h) * E + t * CPT;
#pragma unroll
        for (int c = 0; c < CPT; c += 2) {
            const uint8_t lo = f32_to_e4m3(fminf(fmaxf(__fdiv_rn(y[h][c], s), -448.0f), 448.0f));
            const uint8_t hi = f32_to_e4m3(fminf(fmaxf(__fdiv_rn(y[h][c + 1], s), -448.0f), 448.0f));
            *reinterpret_cast<uint16_t*>(dst + c) = (uint16_t)(lo | (hi << 8));
        }
    }
    if (hg == 0 && t == 0) qo.scales[r] = s;
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
    __shared__ float fa[HPC], m_sh[HPC], l_sh[HPC];
    __shared__ int last_flag;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int s = blockIdx.x, slices = gridDim.x, hg = blockIdx.y, groups = gridDim.y, r = blockIdx.z;
    const int H = groups * HPC;
    uint8_t* lat = mla_fast_dyn;
    MlaFactors<HPC>* zp = reinterpret_cast<MlaFactors<HPC>*>(mla_fast_dyn + (size_t)chunk * E);
    int* rows = reinterpret_cast<int*>(mla_fast_dyn + (size_t)chunk * (E + 4 * HPC));
    float* fmerge = reinterpret_cast<float*>(rows + chunk);   // [HPC][S]
    float* merge_ml = fmerge + HPC * gridDim.x;                // [2][HPC][S]: m, then l

    ::kbp::pdl_wait();   // q, sel, this step's cache row and seq_len: written by earlier kernels
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

    // Publish this slice's partial, count the arrival; the last CTA of the head group merges.
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
    __threadfence();
    __syncthreads();
    if (t == 0) {
        uint32_t* cnt = counters + (size_t)r * groups + hg;
        const uint32_t old = atomicAdd(cnt, 1u);
        last_flag = old == (uint32_t)(slices - 1);
        if (last_flag) *cnt = 0u;   // every slice arrived: ready for the next launch
    }
    __syncthreads();
    if (!last_flag) return;
    __threadfence();
    float y[HPC][CPT];
    mla_fast_merge<E, HPC>(partials + ((size_t)r * slices * H + hg * HPC) * PS, slices, (size_t)H * PS, s_k, fmerge,
                           merge_ml, m_sh, l_sh,
                           out == nullptr ? nullptr : out + ((size_t)r * H + hg * HPC) * E, y);
    if constexpr (QUANT) mla_fast_quant<E, HPC>(y, hg, groups, r, qo);
}

template <int E, int HPC>
__global__ void __launch_bounds__(MLA_FAST_THREADS) glm_mla_decode_fast(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, int chunk, __nv_bfloat16* out,
    float* partials, uint32_t* counters) {
    glm_mla_decode_fast_body<E, HPC>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, chunk, out,
                                     partials, counters);
}

template <int E, int HPC>
__global__ void __launch_bounds__(MLA_FAST_THREADS) glm_mla_decode_fast_quant(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, int chunk, __nv_bfloat16* out,
    float* partials, uint32_t* counters, uint8_t* codes, float* scales, uint32_t* sync) {
    glm_mla_decode_fast_body<E, HPC, true>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, chunk,
                                           out, partials, counters, MlaQuantOut{codes, scales, sync});
}

}  // namespace kbp
