// glm_mla_decode.cuh: sparse NoPE MLA decode over the paged FP8 latent cache (absorbed form),
// split over the attended tokens: every latent row is read once per CTA for all of its heads, and
// the partial softmax states are combined by a fixed merge tree, bit-exact with the family's order.
//
// Launch contract
//   glm_mla_decode_split<E, V, G, HPC><<<dim3(V, H / HPC, rows), MLA_SPLIT_THREADS>>>(
//       q, cache, block_table, page_size, sel, width, seq_len, s_k, out, merge, counters)
//   q            const __nv_bfloat16 [rows][H][E]  absorbed queries
//   cache        const uint8_t [num_pages][P][E]   E4M3 latent rows (glm_mla_latent_write.cuh)
//   block_table  const int32_t [logical pages]     physical page of each logical page
//   page_size    P (tokens per page)
//   sel          const int32_t [rows][width]       token ids from dsa_indexer.cuh; -1 and ids
//                                                  outside [0, seq_len[0]) are skipped,
//                                                  duplicates attended twice
//   seq_len      const int32_t [1]                 S, read on the device (graph-replay safe)
//   s_k          float                             static cache scale
//   out          __nv_bfloat16 [rows][H][E]
//   merge        float [rows][V][H][E + 2]         the V CTAs' partial states: the tree's leaves
//   counters     uint32_t [rows][V][H]             [row][0][hg], [row][1][hg]: head group hg's
//                                                  arrive and depart counts; zero at launch, left zero
//   E a multiple of 512; V (16 in the blueprint) a power of two >= 2; G * HPC a power of two
//   <= 32 with G <= 4; H a multiple of HPC. Static shared memory about 2 * 8G * E bytes.
//
// Math (explain.families.glm_mla_decode; reference kbpc/reference/glm_mla_decode.py, whose order
// is that of one CTA of V warps): group g of G consecutive entries belongs to (virtual) warp g % V,
// which walks its groups in increasing g, entries in list order; per token v = fl(s_k * e4m3(code)),
// lane l sums fl(q_c v_c) over c = 16(l + 32i) + k sequentially, an xor butterfly gives the dot,
// z = fl(dot * fl(1/sqrtf(E))); online update token by token (m' = max(m, z), a = exp(m - m'),
// p = exp(z - m'), l = l a + p, o = o a + p v); the V warp states merged by a halving tree (warp w
// absorbs warp w + stride, stride = V/2 .. 1); out = rn_bf16(o / l), zeros when no token is valid.
//
// Split. CTA (w, hg, row) is virtual warp w for heads hg*HPC .. hg*HPC + HPC - 1. It walks w's
// groups in chunks of 8 groups, staged in shared memory with cp.async (double-buffered): its 8
// warps compute the chunk's dots, one group each (HPC * G dots reduced by one transposed
// butterfly, the xor butterfly's pairs); HPC warps turn them into the chunk's factors a_j, p_j
// (a prefix max over the chunk from the running max; a = 1 exactly when the max does not grow);
// then every thread runs the sequential updates o = o a_j + p_j v_j for its channels, in entry
// order: the same operations in the same order as one warp of the reference. The merge tree runs
// after an arrival barrier of the head group's V CTAs, each merging a share of the outputs down the
// whole tree (mla_split_merge): the same operations per output as the pairwise merge it replaced.
// Each kernel NAME is a thin __global__ over NAME_body (a __device__ function), so a translation
// unit may wrap the body in an extern "C" kernel with the same launch bounds.
// glm_mla_decode_split carries phase stamps (kbp_stamps.cuh): 3 attended, 4 leaves published, 5 tree factors.
#pragma once

#include "dsa_indexer_common.cuh"   // transpose_reduce, cp.async helpers
#include "kbp_common.cuh"

namespace kbp {

constexpr int MLA_SPLIT_THREADS = 256;
constexpr int MLA_SPLIT_WARPS = MLA_SPLIT_THREADS / 32;

// Two E4M3 codes (the low 16 bits of w) -> their exact FP32 values.
__device__ __forceinline__ float2 mla_codes2(uint32_t w) {
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(hr));
}

// 16 E4M3 codes (one uint4) -> 16 FP32 values times s_k.
__device__ __forceinline__ void mla_decode16(const uint4 raw, float s_k, float (&v)[16]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float2 f = mla_codes2(w[i] >> (16 * h));
            v[4 * i + 2 * h] = f.x * s_k;
            v[4 * i + 2 * h + 1] = f.y * s_k;
        }
    }
}

// The queries of HPC heads from `q` (their [HPC][E] BF16 rows), as lane `lane` of a dot needs them:
// qf[h][i][k] = channel 16 (lane + 32 i) + k of head h, in FP32 (exact).
template <int E, int HPC>
__device__ __forceinline__ void mla_load_queries(const __nv_bfloat16* q, int lane, float (&qf)[HPC][E / 512][16]) {
#pragma unroll
    for (int h = 0; h < HPC; ++h)
#pragma unroll
        for (int i = 0; i < E / 512; ++i) {
            const uint4* src = reinterpret_cast<const uint4*>(q + (size_t)h * E) + 2 * (lane + 32 * i);
            const uint4 a = ld_step(src), b = ld_step(src + 1);   // step data: after pdl_wait
            const uint32_t u[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                qf[h][i][2 * k] = __uint_as_float(u[k] << 16);
                qf[h][i][2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
            }
        }
}

template <int A, int B>
__device__ __forceinline__ void mla_zero(float (&o)[A][B]) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
        for (int b = 0; b < B; ++b) o[a][b] = 0.0f;
}

// Groups per chunk: 8 (one per warp for the dots) while two chunks of latent rows fit in 32 KB.
__host__ __device__ constexpr int mla_split_groups_per_chunk(int e, int g) {
    return 16384 / (g * e) >= MLA_SPLIT_WARPS ? MLA_SPLIT_WARPS : 16384 / (g * e);
}

template <int HPC>
struct alignas(HPC >= 4 ? 16 : 4 * HPC) MlaFactors {
    float h[HPC];
};

// The factors of one entry for the CTA's heads, in one shared-memory vector load where it fits.
template <int HPC>
__device__ __forceinline__ MlaFactors<HPC> mla_load_factors(const MlaFactors<HPC>& f) {
    MlaFactors<HPC> r;
    if constexpr (HPC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < HPC; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(f.h + i);
            r.h[i] = v.x; r.h[i + 1] = v.y; r.h[i + 2] = v.z; r.h[i + 3] = v.w;
        }
    } else if constexpr (HPC == 2) {
        const float2 v = *reinterpret_cast<const float2*>(f.h);
        r.h[0] = v.x; r.h[1] = v.y;
    } else {
        r.h[0] = f.h[0];
    }
    return r;
}

template <int E, int G, int HPC>
struct MlaSplitSmem {
    static constexpr int NC = mla_split_groups_per_chunk(E, G) * G;   // entries per chunk
    alignas(16) uint8_t lat[2][NC][E];                                 // staged latent rows
    int rows[MLA_SPLIT_THREADS];                                       // cache rows of a batch, -1 skipped
    int valid[2][NC];
    float z[HPC][NC];                                                  // [head in CTA][entry]
    MlaFactors<HPC> a[NC], p[NC];                                      // [entry]: one vector load per entry
    float m[HPC], l[HPC];
};

// Dots of the chunk in `buf`: warp `warp` < GPC takes the chunk's group `warp` (entries warp*G ..
// warp*G + G - 1) for the CTA's heads: z = fl(dot * scale) into sm.z[head][entry].
template <int E, int G, int HPC>
__device__ __forceinline__ void mla_split_dots(MlaSplitSmem<E, G, HPC>& sm, int buf,
                                               const float (&qf)[HPC][E / 512][16], float s_k, float scale) {
    constexpr int CH = E / 512, SLOTS = G * HPC, GPC = mla_split_groups_per_chunk(E, G);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= GPC) return;
    float part[SLOTS];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int jj = warp * G + j;
        if (sm.valid[buf][jj]) {
#pragma unroll
            for (int i = 0; i < CH; ++i) {
                float v[16];
                mla_decode16(*reinterpret_cast<const uint4*>(&sm.lat[buf][jj][16 * (lane + 32 * i)]), s_k, v);
#pragma unroll
                for (int h = 0; h < HPC; ++h)
#pragma unroll
                    for (int k = 0; k < 16; ++k) {
                        const float prod = qf[h][i][k] * v[k];
                        part[h * G + j] = (i == 0 && k == 0) ? prod : part[h * G + j] + prod;
                    }
            }
        } else {
#pragma unroll
            for (int h = 0; h < HPC; ++h) part[h * G + j] = 0.0f;
        }
    }
    const float dot = transpose_reduce<SLOTS>(part, lane);   // lanes s * 32/SLOTS .. hold slot s
    const int slot = lane / (32 / SLOTS);
    if (lane % (32 / SLOTS) == 0) sm.z[slot / G][warp * G + slot % G] = dot * scale;
}

// Factors of the chunk, for warp h < HPC, lane j = entry j (lanes >= NC act as skipped entries).
// With prev the running max before entry j: z > prev gives a = exp(prev - z), p = exp(0) = 1,
// else a = exp(0) = 1, p = exp(z - prev). Returns the running max after the chunk.
template <int E, int G, int HPC>
__device__ __forceinline__ float mla_split_factors(MlaSplitSmem<E, G, HPC>& sm, int buf, float m_run) {
    constexpr int NC = MlaSplitSmem<E, G, HPC>::NC;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool ok = lane < NC && sm.valid[buf][lane];
    const float z = ok ? sm.z[warp][lane] : -INFINITY;
    float incl = z;   // prefix max over the chunk (exact in any order)
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl = fmaxf(incl, u);
    }
    const float before = __shfl_up_sync(0xffffffffu, incl, 1);
    const float prev = fmaxf(m_run, lane == 0 ? -INFINITY : before);
    float a = 1.0f, p = 0.0f;
    if (ok) {
        if (z > prev) {
            a = kbp::exp_f32(prev - z);
            p = 1.0f;
        } else {
            p = kbp::exp_f32(z - prev);
        }
    }
    if (lane < NC) {
        sm.a[lane].h[warp] = a;
        sm.p[lane].h[warp] = p;
    }
    return fmaxf(m_run, __shfl_sync(0xffffffffu, incl, 31));
}

// Sequential updates, entry by entry: o = o a + p v for this thread's channels of every head of the
// CTA, and l = l a + p for head t when t < HPC.
template <int E, int G, int HPC, int CPT>
__device__ __forceinline__ void mla_split_update(MlaSplitSmem<E, G, HPC>& sm, int buf, float s_k,
                                                 float (&o)[HPC][CPT], float& l_run) {
    constexpr int NC = MlaSplitSmem<E, G, HPC>::NC;
    const int t = threadIdx.x;
    for (int j = 0; j < NC; ++j) {
        if (!sm.valid[buf][j]) continue;
        float v[CPT];
#pragma unroll
        for (int cc = 0; cc < CPT; ++cc) v[cc] = e4m3_to_f32(sm.lat[buf][j][t * CPT + cc]) * s_k;
        const MlaFactors<HPC> a = mla_load_factors(sm.a[j]), p = mla_load_factors(sm.p[j]);
#pragma unroll
        for (int h = 0; h < HPC; ++h)
#pragma unroll
            for (int cc = 0; cc < CPT; ++cc) o[h][cc] = o[h][cc] * a.h[h] + p.h[h] * v[cc];
#pragma unroll
        for (int h = 0; h < HPC; ++h)
            if (t == h) l_run = l_run * a.h[h] + p.h[h];
    }
}

constexpr long long kMlaSpinLimit = 1LL << 24;   // polls (~5 s) before a lost arrival traps

// Arrival barrier of `total` CTAs on cnt[0] (arrive) and *depart (depart), both zero at launch and
// left zero: after it, every CTA sees what the others wrote before arriving (read through L2). The
// `total` CTAs must become resident together: the decode kernels release their dependents right
// after pdl_wait, so no dependent takes an SM before every CTA of the grid has started, and nothing
// else waits for the grid. A grid larger than the GPU holds (many heads or rows: the seed's exact
// decode is 128 CTAs, two fit an SM) relies on CTAs starting in launch order, so that a barrier's
// CTAs (consecutive in x) are never all waiting for slots held by other waiting groups; a lost
// arrival traps instead of hanging.
__device__ __forceinline__ void mla_barrier(uint32_t* cnt, uint32_t* depart, uint32_t total) {
    __syncthreads();   // the CTA's global writes before thread 0's fence (cumulative)
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(cnt, 1u) + 1u < total)
            for (long long n = 0; ld_acquire_gpu(cnt) < total; ++n)
                if (n > kMlaSpinLimit) __trap();   // a CTA never arrived: a bug, never a hang
        __threadfence();
        if (atomicAdd(depart, 1u) == total - 1u) {   // every CTA is past its spin
            *cnt = 0u;
            *depart = 0u;
        }
    }
    __syncthreads();
}

// The merge tree of the V CTAs of (hg, row), spread over them: each publishes its state (o, m, l
// per head) in its slot and arrives at the head group's barrier (counters [row][0][hg] and
// [row][1][hg]); then warp W-1-h forms head h's tree factors (level stride = V/2 .. 1: node u
// absorbs node u + stride, m = max, x = exp(m_node - m) or 0 for an empty node, l = l_u x_u +
// l_v x_v), and CTA w merges outputs [w P, w P + P) of the group's HPC E (P = HPC E / V rounded
// up), each output by one thread: its V leaf values loaded at once, then o_u = o_u x_u + o_v x_v
// down the same tree. The operations and their order per output are the pairwise form's (each
// level's second-arriving CTA merged its partner into itself; the merge is symmetric in its
// operands), so the bits are too; out = rn_bf16(o / l), zeros for a head with no valid token.
// (The pairwise form took four dependent fence + arrival + reload rounds, one a level; H200,
// 128-expert seed shrink, exact build, 1k: the decode ends 3.2 us sooner, the DSA sublayer 103.7
// instead of 106.7 us; bench/NOTES.md, twenty-ninth session.)
template <int E, int V, int HPC, int CPT>
__device__ __forceinline__ void mla_split_merge(const float (&o)[HPC][CPT], const float* m_sh, const float* l_sh,
                                                float* merge, uint32_t* counters, int w, int hg, int r, int H,
                                                __nv_bfloat16* out) {
    static_assert(V <= 32, "one lane a leaf in the factor warps");
    constexpr int LEVELS = V >= 32 ? 5 : V >= 16 ? 4 : V >= 8 ? 3 : V >= 4 ? 2 : 1;   // log2 V
    __shared__ float tfa[HPC][V], tfb[HPC][V], troot[HPC];   // level stride s, node u at [s + u]
    const int t = threadIdx.x, lane = t & 31;
    constexpr size_t PS = E + 2;
    float* leaf = merge + (((size_t)r * V + w) * H + hg * HPC) * PS;
#pragma unroll
    for (int h = 0; h < HPC; ++h)
#pragma unroll
        for (int cc = 0; cc < CPT; ++cc) __stcg(leaf + h * PS + t * CPT + cc, o[h][cc]);
    if (t < HPC) {
        __stcg(leaf + t * PS + E, m_sh[t]);
        __stcg(leaf + t * PS + E + 1, l_sh[t]);
    }
    uint32_t* cnt = counters + (size_t)r * V * H + hg;
    mla_barrier(cnt, cnt + H, (uint32_t)V);
    KBP_STAMP(4);   // the head group's V partial states published (arrival barrier passed)
    const float* leaves = merge + ((size_t)r * V * H + hg * HPC) * PS;   // leaf u at u * H * PS
    const size_t leaf_stride = (size_t)H * PS;
    const int share = (HPC * E + V - 1) / V, lo = min(HPC * E, w * share), hi = min(HPC * E, lo + share);
    const int h_f = MLA_SPLIT_WARPS - 1 - (t >> 5);
    const bool factors = h_f < HPC, early = !factors && lo + t < hi;
    float x[V];
    if (factors) {   // head h_f's tree factors, lane u holding node u
        float m = -INFINITY, l = 0.0f;
        if (lane < V) {
            m = __ldcg(leaves + lane * leaf_stride + h_f * PS + E);
            l = __ldcg(leaves + lane * leaf_stride + h_f * PS + E + 1);
        }
#pragma unroll
        for (int k = 1; k <= LEVELS; ++k) {   // strides V/2 .. 1, as the outputs' tree below
            const int st = V >> k;
            const float mb = __shfl_down_sync(0xffffffffu, m, st), lb = __shfl_down_sync(0xffffffffu, l, st);
            if (lane < st) {
                const float ms = fmaxf(m, mb);
                const float xa = m == -INFINITY ? 0.0f : exp_f32(m - ms);
                const float xb = mb == -INFINITY ? 0.0f : exp_f32(mb - ms);
                tfa[h_f][st + lane] = xa;
                tfb[h_f][st + lane] = xb;
                l = l * xa + lb * xb;
                m = ms;
            }
        }
        if (lane == 0) troot[h_f] = l;
    } else if (early) {   // the first output's leaves, while the factor warps run
        const float* p = leaves + ((lo + t) / E) * PS + (lo + t) % E;
#pragma unroll
        for (int u = 0; u < V; ++u) x[u] = __ldcg(p + u * leaf_stride);
    }
    __syncthreads();   // tfa, tfb, troot
    KBP_STAMP(5);   // tree factors formed (and the first output's leaves loaded)
    for (int i = lo + t; i < hi; i += MLA_SPLIT_THREADS) {
        const int h = i / E;
        if (i != lo + t || !early) {
            const float* p = leaves + (size_t)h * PS + i % E;
#pragma unroll
            for (int u = 0; u < V; ++u) x[u] = __ldcg(p + u * leaf_stride);
        }
#pragma unroll
        for (int k = 1; k <= LEVELS; ++k) {   // strides V/2 .. 1 by a counted loop: unrolled, x in registers
            const int st = V >> k;
#pragma unroll
            for (int u = 0; u < V / 2; ++u)   // a constant bound too (u < st is then known at each level)
                if (u < st) x[u] = x[u] * tfa[h][st + u] + x[u + st] * tfb[h][st + u];
        }
        const float lh = troot[h];
        out[((size_t)r * H + hg * HPC) * E + i] = f32_to_bf16(lh > 0.0f ? x[0] / lh : 0.0f);
    }
}

template <int E, int V, int G, int HPC>
__device__ __forceinline__ void glm_mla_decode_split_body(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, __nv_bfloat16* out,
    float* merge, uint32_t* counters) {
    static_assert(E % 512 == 0, "a lane owns 16-byte chunks of 16 channels");
    static_assert(V >= 2 && (V & (V - 1)) == 0, "halving merge tree");
    static_assert(G >= 1 && G <= 4 && HPC >= 1 && (G * HPC) <= 32 && ((G * HPC) & (G * HPC - 1)) == 0,
                  "one transposed butterfly reduces a group's dots for the CTA's heads");
    constexpr int GPC = mla_split_groups_per_chunk(E, G), NC = GPC * G;
    constexpr int CH = E / 512, CPT = E / MLA_SPLIT_THREADS;
    constexpr int CPE = E / 16, TPE = MLA_SPLIT_THREADS / NC;   // 16-byte copies per entry, threads per entry
    static_assert(GPC >= 1 && NC <= 32 && MLA_SPLIT_THREADS % NC == 0 && CPE % TPE == 0, "chunk geometry");
    using Smem = MlaSplitSmem<E, G, HPC>;
    static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory");
    __shared__ Smem sm;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int w = blockIdx.x, hg = blockIdx.y, r = blockIdx.z, H = gridDim.y * HPC;
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // q, sel, the cache row of this step: written by earlier kernels
    KBP_STAMP(kStampWaitOut);
    const int seq_len = seq_len_ptr[0];
    sel += (size_t)r * width;
    const int groups = (width + G - 1) / G;
    const int my_groups = w < groups ? (groups - w + V - 1) / V : 0;

    // Entry x of this CTA's list (x = G * (its group index) + position in the group) is selection
    // entry (w + V * (x / G)) * G + x % G. Rows are looked up a batch of MLA_SPLIT_THREADS entries
    // at a time (one per thread; the seed's lists fit in one), then staged chunk by chunk.
    auto lookup = [&](int x) -> int {
        const int gi = x / G, e = (w + V * gi) * G + x % G;
        const int id = gi < my_groups && e < width ? sel[e] : -1;
        return id >= 0 && id < seq_len ? block_table[id / page_size] * page_size + id % page_size : -1;
    };
    auto stage = [&](int c) {   // chunk c of the current batch
        const int buf = c & 1, jj = t / TPE, part = t % TPE;
        const int row = sm.rows[c * NC + jj];
        if (part == 0) sm.valid[buf][jj] = row >= 0;
        if (row >= 0) {
            const uint8_t* src = cache + (size_t)row * E;
#pragma unroll
            for (int i = 0; i < CPE / TPE; ++i) {
                const int off = 16 * (part + TPE * i);
                cp_async16(&sm.lat[buf][jj][off], src + off);
            }
        }
        cp_async_commit();
    };

    float qf[HPC][CH][16];
    mla_load_queries<E, HPC>(q + ((size_t)r * H + hg * HPC) * E, lane, qf);
    const float scale = 1.0f / sqrtf((float)E);
    float o[HPC][CPT];
    mla_zero(o);
    float m_run = -INFINITY;   // warps h < HPC: head h's running max
    float l_run = 0.0f;        // threads h < HPC: head h's running sum

    for (int batch = 0; batch < my_groups * G; batch += MLA_SPLIT_THREADS) {
        const int chunks = (min(MLA_SPLIT_THREADS, my_groups * G - batch) + NC - 1) / NC;
        __syncthreads();   // the previous batch's rows are no longer read
        sm.rows[t] = lookup(batch + t);
        __syncthreads();
        stage(0);
        for (int c = 0; c < chunks; ++c) {
            const int buf = c & 1;
            cp_async_step(stage, c, chunks);
            mla_split_dots(sm, buf, qf, s_k, scale);
            __syncthreads();
            if (warp < HPC) m_run = mla_split_factors(sm, buf, m_run);
            __syncthreads();
            mla_split_update(sm, buf, s_k, o, l_run);
            __syncthreads();   // the chunk's buffer is restaged two chunks on
        }
    }

    KBP_STAMP(3);   // attend phase done (the CTA's partial state in registers)
    if (warp < HPC && lane == 0) sm.m[warp] = m_run;
    if (t < HPC) sm.l[t] = l_run;
    __syncthreads();
    mla_split_merge<E, V, HPC, CPT>(o, sm.m, sm.l, merge, counters, w, hg, r, H, out);
}

template <int E, int V, int G, int HPC>
__global__ void __launch_bounds__(MLA_SPLIT_THREADS) glm_mla_decode_split(
    const __nv_bfloat16* q, const uint8_t* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, float s_k, __nv_bfloat16* out,
    float* merge, uint32_t* counters) {
    KBP_STAMP_BEGIN();
    glm_mla_decode_split_body<E, V, G, HPC>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, out,
                                            merge, counters);
    KBP_STAMP_END();
}

// The unquantized form (kbpc compile --no-act-quant, a debugging aid; kbpc/reference/no_act_quant.py
// mla_attention) over the FP32 latent cache that glm_mla_latent_write_f32_paged fills:
//   glm_mla_decode_f32<E><<<dim3(H, rows), 256>>>(q, cache, block_table, page_size, sel, width, seq_len, out)
// z_j = <q_h, c_j> / sqrt(E) and a plain FP32 online softmax over the valid entries in list order
// (duplicates twice), out = rn_bf16(o / l), zeros when no entry is valid. One CTA per head and row,
// E / 256 channels a thread; the dot's order (per-thread sums, warp butterflies, then the 8 warp
// sums in order) is this kernel's, so it agrees with the reference to FP32 rounding, not bit for bit.
template <int E>
__global__ void __launch_bounds__(256) glm_mla_decode_f32(
    const __nv_bfloat16* q, const float* cache,
    const int32_t* block_table, int page_size, const int32_t* sel, int width,
    const int32_t* seq_len_ptr, __nv_bfloat16* out) {
    static_assert(E % 256 == 0 && E <= 4096, "whole channels per thread");
    constexpr int CPT = E / 256;
    __shared__ float warp_dots[8];
    const int t = threadIdx.x, h = blockIdx.x, r = blockIdx.y, heads = gridDim.x;
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    ::kbp::pdl_wait();   // q, sel and this step's cache row come from earlier kernels
    const int seq_len = seq_len_ptr[0];
    const __nv_bfloat16* qh = q + ((size_t)r * heads + h) * E;
    float qf[CPT], o[CPT];
#pragma unroll
    for (int c = 0; c < CPT; ++c) {
        qf[c] = bf16_to_f32(qh[t + 256 * c]);
        o[c] = 0.0f;
    }
    const float root = sqrtf((float)E);
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < width; ++j) {
        const int id = sel[(size_t)r * width + j];
        if (id < 0 || id >= seq_len) continue;   // uniform over the block
        const float* row = cache + ((size_t)block_table[id / page_size] * page_size + id % page_size) * E;
        float v[CPT], part = 0.0f;
#pragma unroll
        for (int c = 0; c < CPT; ++c) {
            v[c] = row[t + 256 * c];
            part = __fmaf_rn(qf[c], v[c], part);
        }
        part = warp_sum_xor(part);
        __syncthreads();   // the previous entry's warp sums are read
        if ((t & 31) == 0) warp_dots[t >> 5] = part;
        __syncthreads();
        float dot = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; ++w) dot += warp_dots[w];
        const float z = dot / root;
        const float m2 = fmaxf(m, z);
        const float a = expf(m - m2), p = expf(z - m2);
        l = l * a + p;
#pragma unroll
        for (int c = 0; c < CPT; ++c) o[c] = o[c] * a + p * v[c];
        m = m2;
    }
    __nv_bfloat16* dst = out + ((size_t)r * heads + h) * E;
#pragma unroll
    for (int c = 0; c < CPT; ++c) dst[t + 256 * c] = f32_to_bf16(l > 0.0f ? o[c] / l : 0.0f);
}

}  // namespace kbp
