// dsa_index_select.cuh: the indexer's selection in one launch over the whole GPU: pool scores
// for all index heads, a deterministic top-k of the pools, and their expansion to token ids
// (family header dsa_indexer.cuh: state, math, order).
//
// Launch contract
//   dsa_index_select<H, D, KP, TOPK_POOLS, FP8, BITS, QROT, MMA, ORDER_FREE><<<G, DSA_SELECT_THREADS>>>(q, raw_w,
//       pool_keys, pool_codes, pool_scales, seq_len, tau, scores, hist, arrive, cand, sel_tokens)
//   q float [H][D]; raw_w float [H] = (W_w x)_h; pool keys as the family header says (FP8 picks
//   pool_codes + pool_scales, else pool_keys; the other pointers may be null); scores float
//   [capacity]; hist uint32 [2^BITS] and arrive uint32 [2], both zero at launch and left zero;
//   cand uint64 [DSA_FILTER_CAP] or null (no candidate filter); sel_tokens int32 [(TOPK_POOLS + 1) * KP]. Any G >= 1 (one CTA per SM fills the GPU); H <= 128,
//   D a multiple of 32 and <= 128 (a power of two for FP8), TOPK_POOLS <= DSA_SELECT_THREADS.
//   QROT (FP8 only; numerics `fast`) scores the codes against the rotated query, below. MMA (FP32
//   cache only; numerics `fast`) scores on BF16 tensor cores (dsa_index_score_mma.cuh). ORDER_FREE
//   (numerics `fast`: the decode reading the list takes it as a set, in an order of its own): the
//   list is the top k pools in index order; when the top k holds every valid pool, with no scores.
//
// Work. Phase 1, every CTA: the valid pools are cut into G contiguous ranges of whole 32-pool
// chunks; a CTA stages its chunks in shared memory (cp.async, double-buffered; the FP8 cache is
// read back through the inverse rotation there), warps score them (a warp holds HW heads' queries
// and reduces 32 (pool, head) dot products at once with one transposed butterfly), and each pool's
// head terms are summed in head order (the MMA form: each warp scores whole 16-pool tiles of the
// CTA's range from registers, no staging or barriers). The CTA writes its scores and adds a histogram of their
// keys' first BITS bits to `hist`; past DSA_FILTER_MIN_POOLS pools (given `cand`) it then lists
// the keys of its scores that can still be selected (dsa_filter_candidates). Phase 2, the last CTA
// to arrive (a fenced counter): finds the histogram bin holding the k-th largest key, gathers the
// keys above it and in it (from the list, or one pass over the scores), selects the top k in the
// total order by a radix select over the 64-bit rank keys (score key, complemented pool index) in
// shared memory, or, when the bin holds more candidates than fit, by radix passes over the scores
// in memory; sorts the k by rank (bitonic) and expands them. It clears `hist` and `arrive` for the
// next launch.
//
// ORDER_FREE. While the context holds at most TOPK_POOLS complete pools (2048 tokens in the seed),
// the top k is every valid pool whatever the scores: the set is known from SEQ and POS alone, and
// only its rank order needs the scores. A consumer that takes the selection as a set (the fast MLA
// decode deals the entries to slices and has its own accumulation order) does not need that order,
// so CTA 0 writes pools 0 .. k-1 in index order (then the tail, then -1) after the wait and every
// CTA returns: no key is read, scores, hist and arrive are left as they are (zero). Past that
// context the launch scores and selects as the ranked form does (the same scores and the same
// set), then lists the set in index order instead of compacting and sorting it by rank
// (dsa_list_in_index_order: a bitmap and a prefix count, deterministic; the compaction and the
// bitonic sort of the 512 picks took 4.4-4.6 us of the select alone at every context past 1k,
// twelfth session). kbpc.reference.dsa_indexer.index_order_selection is that list.
//
// QROT. The normalised Walsh-Hadamard matrix is symmetric and orthogonal (FWHT(FWHT(x)) = D x), so
// q . ktilde = q . FWHT(sigma c) / D = (sigma / D) (FWHT(q) . c), c = e4m3(code). Each warp rotates
// its heads' queries once per launch, qhat = fl(FWHT(q) * fl(1/sqrtf(D)) / D) (the factor is exact),
// and a pool's head dot is x = fl(qhat . c) * sigma (a power of two: exact in the normal range):
// no per-pool rotation. Lane l holds channels J l .. J l + J - 1 (one 32-bit word of codes for
// D = 128) and sums them by FMA from the first product, then the 32-lane butterfly. This rounds
// differently from the read-back; the bound is kbpc/reference/dsa_indexer.py rotated_score_bound.
// The selection code is the same, so the selected pools are the top k of the scores written.
#pragma once

#include "dsa_index_score_mma.cuh"

namespace kbp {

constexpr int DSA_SELECT_THREADS = 512;
constexpr int DSA_SELECT_WARPS = DSA_SELECT_THREADS / 32;
constexpr int DSA_SELECT_CHUNK = 32;        // pools staged and scored per step
constexpr int DSA_SELECT_RANK_SLOTS = 4096; // 64-bit rank keys in shared memory: candidates + sorted
// The candidate filter (contexts past DSA_FILTER_MIN_POOLS pools, when the launch gets `cand`):
// each CTA lists its own scores that can still be selected, so the last CTA reads that list
// instead of every score. DSA_FILTER_CAP rank keys fit the list; past it the last CTA scans.
// H200, 128-expert seed shrink, the 524288 build, interleaved with the build without it: the
// select in the step 30.2 -> 25.9 us at 128k, `kbpc bench` 5.138 / 5.134 -> 5.059 / 5.078 ms at
// 128k and 5.451 / 5.473 -> 5.333 / 5.336 at 512k (bench/NOTES.md, thirty-first session).
constexpr int DSA_FILTER_MIN_POOLS = 8192;
constexpr int DSA_FILTER_CAP = 8192;

// Heads per warp: 8, or the next power of two of H when H < 8.
__host__ __device__ constexpr int dsa_heads_per_warp(int h) { return h >= 8 ? 8 : dsa_pow2_at_least(h); }

template <int H, int D, bool FP8>
struct DsaSelectPhase1 {
    static constexpr int RAW = FP8 ? 1 : 4;   // bytes per staged channel
    alignas(16) uint8_t raw[2][DSA_SELECT_CHUNK * D * RAW];   // double-buffered staging
    float scales[2][DSA_SELECT_CHUNK];                        // FP8 only
    alignas(16) float keys[FP8 ? DSA_SELECT_CHUNK * D : 1];  // FP8 only: the read-back keys
    float terms[DSA_SELECT_CHUNK][H + 1];
};

template <bool C, class A, class B> struct DsaPick { using type = A; };
template <class A, class B> struct DsaPick<false, A, B> { using type = B; };

template <int H, int D, bool FP8, int BITS, bool MMA>
struct DsaSelectSmem {
    union {   // phase 1: the staging of the CUDA-core form or the query fragments of the MMA form
        typename DsaPick<MMA, DsaSelectMmaSmem<H, D>, DsaSelectPhase1<H, D, FP8>>::type p1;
        unsigned long long rank[DSA_SELECT_RANK_SLOTS];       // phase 2: candidates, then sorted
    };
    uint32_t hist[1 << BITS];
    uint32_t wsum[DSA_SELECT_WARPS];
    uint32_t count, count2, bin, n_gt, digit, above;
    int last;
};

// Warp 0 picks the digit d of an nb-bin histogram (nb <= 256) with above(d) < kk <= above(d) +
// h[d], above(d) = sum of the bins above d; writes d and above(d) to the shared slots.
__device__ __forceinline__ void dsa_pick_digit(const uint32_t* h, int nb, uint32_t kk, uint32_t* digit,
                                               uint32_t* above_out) {
    const int lane = threadIdx.x & 31;
    uint32_t local = 0;
#pragma unroll
    for (int b = 0; b < 8; ++b) local += 8 * lane + b < nb ? h[8 * lane + b] : 0u;
    uint32_t incl = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const uint32_t t = __shfl_down_sync(0xffffffffu, incl, off);
        if (lane + off < 32) incl += t;
    }
    uint32_t above = incl - local;
    if (above < kk && kk <= incl) {
        for (int b = 7; b >= 0; --b) {
            const uint32_t c = 8 * lane + b < nb ? h[8 * lane + b] : 0u;
            if (above + c >= kk) {
                *digit = (uint32_t)(8 * lane + b);
                *above_out = above;
                break;
            }
            above += c;
        }
    }
}

// Radix select, most significant digit first, of the kk-th largest rank key among the elements
// `each` visits (every element shares bits [top, 64) with `prefix`). Returns T with exactly kk
// elements >= T. h is >= 256 words of shared scratch; called by the whole block.
template <typename Each>
__device__ unsigned long long dsa_radix_select(Each each, unsigned long long prefix, int top, uint32_t kk,
                                               uint32_t* h, uint32_t* digit, uint32_t* above) {
    while (true) {
        const int shift = top > 8 ? top - 8 : 0, nb = 1 << (top - shift);
        for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
        __syncthreads();
        each([&](unsigned long long x) {
            if (top == 64 || (x >> top) == (prefix >> top)) dsa_hist_add(h, (uint32_t)((x >> shift) & (nb - 1)));
        });
        __syncthreads();
        if (threadIdx.x < 32) dsa_pick_digit(h, nb, kk, digit, above);
        __syncthreads();
        const uint32_t d = *digit, a = *above, cnt = h[d];
        __syncthreads();   // the scratch is cleared at the top of the next pass
        prefix |= (unsigned long long)d << shift;
        kk -= a;
        top = shift;
        if (cnt == kk || top == 0) return prefix;
    }
}

// The smallest score whose key's first BITS bits are at least b: the float of key b << (32 - BITS),
// -inf where that key is below -inf's (NaN patterns), NaN (nothing is >= it) past +inf's.
template <int BITS>
__device__ __forceinline__ float dsa_bin_floor(uint32_t b) {
    if (b >= (1u << BITS)) return __uint_as_float(0x7fffffffu);
    const uint32_t key = b << (32 - BITS);
    if (key <= 0x007fffffu) return -INFINITY;
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Visit (score, index) for every score >= at_least of scores[0, n) (written by other CTAs: read from
// L2), with 32 loads per thread in flight. A single CTA scans up to 131072 pools: a float4 whose
// largest score is below at_least costs four instructions, so the scan is bound by the L2 round
// trips, not by the visits (the selection's floors leave a few hundred scores). scores is 16-byte
// aligned (a state buffer); scores are NaN-free.
template <typename Fn>
__device__ __forceinline__ void dsa_for_each_score(const float* scores, int n, float at_least, Fn fn) {
    constexpr int U = 8;   // float4 loads per thread per batch: 64 KB in flight for the block
    const int tid = threadIdx.x, nt = blockDim.x, n4 = n / 4;
    const float4* s4 = reinterpret_cast<const float4*>(scores);
    for (int base = 0; base < n4; base += U * nt) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * nt + tid;
            v[u] = i < n4 ? __ldcg(s4 + i) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = base + u * nt + tid;
            if (i < n4 && fmaxf(fmaxf(v[u].x, v[u].y), fmaxf(v[u].z, v[u].w)) >= at_least) {
                if (v[u].x >= at_least) fn(v[u].x, 4 * i);
                if (v[u].y >= at_least) fn(v[u].y, 4 * i + 1);
                if (v[u].z >= at_least) fn(v[u].z, 4 * i + 2);
                if (v[u].w >= at_least) fn(v[u].w, 4 * i + 3);
            }
        }
    }
    for (int i = 4 * n4 + tid; i < n; i += nt) {
        const float v = __ldcg(scores + i);
        if (v >= at_least) fn(v, i);
    }
}

// Exclusive suffix sum over the block of one value per thread (sum over the threads above).
__device__ __forceinline__ uint32_t dsa_block_suffix(uint32_t v, uint32_t* wsum) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint32_t incl = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const uint32_t t = __shfl_down_sync(0xffffffffu, incl, off);
        if (lane + off < 32) incl += t;
    }
    if (lane == 0) wsum[warp] = incl;
    __syncthreads();
    uint32_t above = incl - v;
    for (int w = warp + 1; w < nw; ++w) above += wsum[w];
    __syncthreads();
    return above;
}

// Descending bitonic sort of one 64-bit value per thread (blockDim.x a power of two).
__device__ __forceinline__ unsigned long long dsa_bitonic_desc(unsigned long long v, unsigned long long* xchg) {
    const int t = threadIdx.x, n = blockDim.x;
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            unsigned long long u;
            if (stride >= 32) {
                __syncthreads();
                xchg[t] = v;
                __syncthreads();
                u = xchg[t ^ stride];
            } else {
                u = __shfl_xor_sync(0xffffffffu, v, stride);
            }
            const bool want_max = ((t & stride) == 0) == ((t & size) == 0);
            v = want_max ? (v > u ? v : u) : (v < u ? v : u);
        }
    }
    return v;
}

// The J codes of channels J l .. J l + J - 1 (J = D / 32 in {1, 2, 4}; src aligned to J bytes).
template <int J>
__device__ __forceinline__ void dsa_e4m3_lane_codes(const uint8_t* src, float (&v)[J]) {
    static_assert(J == 1 || J == 2 || J == 4, "D <= 128");
    if constexpr (J == 1) {
        v[0] = e4m3_to_f32(src[0]);
    } else {
        const uint32_t w = J == 4 ? *reinterpret_cast<const uint32_t*>(src)
                                  : (uint32_t)*reinterpret_cast<const uint16_t*>(src);
#pragma unroll
        for (int i = 0; i < J; i += 2) {   // the lower byte is the lower channel
            const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> (8 * i)), __NV_E4M3);
            const float2 f = __half22float2(__half2(h));
            v[i] = f.x;
            v[i + 1] = f.y;
        }
    }
}

// Phase 1 of the CUDA-core form: score pools [begin, end) of `rows` (the cache's pool rows) in
// staged 32-pool chunks into scores, adding their first BITS key bits to the block's histogram.
// Called by the whole block; ends on a barrier.
template <int H, int D, int BITS, bool FP8, bool QROT>
__device__ __forceinline__ void dsa_score_chunks(DsaSelectPhase1<H, D, FP8>& p1, uint32_t* hist, const float* q,
                                                 const float* raw_w, const char* rows, const float* pool_scales,
                                                 int begin, int end, float* scores) {
    constexpr int T = DSA_SELECT_THREADS, CH = DSA_SELECT_CHUNK, J = D / 32, ROW = FP8 ? D : D * 4;
    constexpr int HW = dsa_heads_per_warp(H), RP = 32 / HW, NHG = (H + HW - 1) / HW;
    constexpr int NPS = DSA_SELECT_WARPS / NHG;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int hg = warp % NHG, ps = warp / NHG;
    const float inv_sqrt_d = 1.0f / sqrtf((float)D);
    float qr[HW][J], w_lane;
    {
        const float inv_sqrt_h = 1.0f / sqrtf((float)H);
#pragma unroll
        for (int hl = 0; hl < HW; ++hl)
#pragma unroll
            for (int j = 0; j < J; ++j) qr[hl][j] = hg * HW + hl < H ? q[(hg * HW + hl) * D + lane + 32 * j] : 0.0f;
        const int hw = hg * HW + lane % HW;
        w_lane = hw < H ? raw_w[hw] * inv_sqrt_h : 0.0f;
    }
    if constexpr (QROT) {   // qhat = FWHT(q) * fl(1/sqrtf(D)) / D, moved to the lane's J channels
        float* xs = p1.keys + warp * D;   // a warp's slice: free until the first chunk is scored
        const float c0 = __fdiv_rn(inv_sqrt_d, (float)D);
#pragma unroll
        for (int hl = 0; hl < HW; ++hl) {
            dsa_fwht_warp<J>(qr[hl], lane);
#pragma unroll
            for (int j = 0; j < J; ++j) xs[lane + 32 * j] = __fmul_rn(qr[hl][j], c0);
            __syncwarp();
#pragma unroll
            for (int j = 0; j < J; ++j) qr[hl][j] = xs[J * lane + j];
            __syncwarp();
        }
    }

    auto stage = [&](int c) {
        const int start = begin + c * CH, cnt = min(CH, end - start), buf = c & 1;
        const char* src = rows + (size_t)start * ROW;
        for (int i = tid; i < cnt * ROW / 16; i += T) cp_async16(p1.raw[buf] + 16 * i, src + 16 * (size_t)i);
        if (FP8 && tid < cnt) p1.scales[buf][tid] = pool_scales[start + tid];
        cp_async_commit();
    };
    const int chunks = (end - begin + CH - 1) / CH;
    if (chunks > 0) stage(0);
    for (int c = 0; c < chunks; ++c) {
        const int start = begin + c * CH, cnt = min(CH, end - start), buf = c & 1;
        cp_async_step(stage, c, chunks);
        const float* kbuf = reinterpret_cast<const float*>(p1.raw[buf]);
        if constexpr (FP8 && !QROT) {   // read back: ktilde = FWHT(sigma * e4m3(code)) / D, one warp per pool
            for (int p = warp; p < cnt; p += DSA_SELECT_WARPS) {
                float v[J];
                const float sigma = p1.scales[buf][p];
#pragma unroll
                for (int j = 0; j < J; ++j) v[j] = e4m3_to_f32(p1.raw[buf][p * D + lane + 32 * j]) * sigma;
                dsa_fwht_warp<J>(v, lane);
#pragma unroll
                for (int j = 0; j < J; ++j) p1.keys[p * D + lane + 32 * j] = __fdiv_rn(v[j], (float)D);
            }
            __syncthreads();
            kbuf = p1.keys;
        }
        if (ps < NPS) {
            for (int r = ps; r * RP < cnt; r += NPS) {
                float part[32];
#pragma unroll
                for (int pl = 0; pl < RP; ++pl) {
                    float kv[J];
                    if constexpr (QROT) {
                        dsa_e4m3_lane_codes<J>(p1.raw[buf] + (r * RP + pl) * D + J * lane, kv);
                    } else {
#pragma unroll
                        for (int j = 0; j < J; ++j) kv[j] = kbuf[(r * RP + pl) * D + lane + 32 * j];
                    }
#pragma unroll
                    for (int hl = 0; hl < HW; ++hl) {
                        float acc = qr[hl][0] * kv[0];
#pragma unroll
                        for (int j = 1; j < J; ++j) acc = QROT ? __fmaf_rn(qr[hl][j], kv[j], acc) : acc + qr[hl][j] * kv[j];
                        part[pl * HW + hl] = acc;
                    }
                }
                const int p = r * RP + lane / HW, h = hg * HW + lane % HW;
                const float factor = QROT ? (p < cnt ? p1.scales[buf][p] : 0.0f) : inv_sqrt_d;
                const float x = transpose_reduce32(part, lane) * factor;   // slot lane = (pl, hl)
                if (h < H && p < cnt) p1.terms[p][h] = w_lane * (x > 0.0f ? x : 0.0f);
            }
        }
        __syncthreads();
        if (tid < cnt) {
            float acc = 0.0f;
#pragma unroll 8
            for (int h = 0; h < H; ++h) acc = acc + p1.terms[tid][h];
            scores[start + tid] = acc;
            dsa_hist_add(hist, dsa_score_key(acc) >> (32 - BITS));
        }
        __syncthreads();   // the staging buffer and the terms are free again
    }
}

// The candidate filter, every CTA after adding its histogram to the global one. A score whose
// first-digit bin is below the k-th largest bin of any histogram that counts only scores of this
// launch cannot be selected: k scores above it exist. Two such histograms bound it from below:
// the CTA's own (h_own, its scores only), and a snapshot of the global one (its counts only grow,
// so its k-th bin is at most the final one, whatever the other CTAs have added so far). The CTA
// stages the rank keys of its scores in [begin, end) at or above the larger of the two bins in
// shared memory (`stage`, the rank slots, free after phase 1), reserves their slots in `cand` with
// one atomic on `count` and copies them there. Past DSA_FILTER_CAP listed keys (or a CTA whose
// keys overflow its staging, which reserves DSA_FILTER_CAP + 1) the last CTA, seeing the count,
// scans every score instead. Every score in a bin at or above the final k-th bin is listed, so
// the last CTA gathers the same keys from the list as from the scores: the selection is unchanged;
// only the list's order depends on timing, and the selection never reads it in order. Called by
// the whole block; ends on a barrier after a fence.
template <int BITS>
__device__ __forceinline__ void dsa_filter_candidates(const uint32_t* h_own, const uint32_t* ghist,
                                                      const float* scores, int begin, int end, uint32_t k,
                                                      unsigned long long* stage, unsigned long long* cand,
                                                      uint32_t* count, uint32_t* wsum, uint32_t* word,
                                                      uint32_t* staged) {
    constexpr int T = DSA_SELECT_THREADS, BPT = (1 << BITS) / T;
    const int tid = threadIdx.x;
    uint32_t snap[BPT], own = 0, seen = 0;
#pragma unroll
    for (int b = 0; b < BPT; ++b) {
        snap[b] = __ldcg(ghist + tid * BPT + b);
        own += h_own[tid * BPT + b];
        seen += snap[b];
    }
    if (tid == 0) { *word = 0; *staged = 0; }
    uint32_t own_above = dsa_block_suffix(own, wsum);   // (its barriers order the resets too)
    uint32_t seen_above = dsa_block_suffix(seen, wsum);
    uint32_t cut = 0;   // bin 0: no bound from this thread's bins
#pragma unroll
    for (int b = BPT - 1; b >= 0; --b) {
        const uint32_t bin = (uint32_t)(tid * BPT + b), c_own = h_own[bin], c_seen = snap[b];
        if (own_above < k && own_above + c_own >= k) cut = max(cut, bin);
        if (seen_above < k && seen_above + c_seen >= k) cut = max(cut, bin);
        own_above += c_own;
        seen_above += c_seen;
    }
    if (cut) atomicMax(word, cut);
    __syncthreads();
    cut = *word;
    for (int i = begin + tid; i < end; i += T) {
        const float v = __ldcg(scores + i);
        if (dsa_score_key(v) >> (32 - BITS) >= cut) {
            const uint32_t at = dsa_append_slot(staged);
            if (at < (uint32_t)DSA_SELECT_RANK_SLOTS) stage[at] = dsa_rank_key(v, i);
        }
    }
    __syncthreads();   // every thread has read `word` (the cut) and staged its keys
    const uint32_t total = *staged;
    const bool fits = total <= (uint32_t)DSA_SELECT_RANK_SLOTS;
    if (tid == 0) *word = atomicAdd(count, fits ? total : (uint32_t)DSA_FILTER_CAP + 1u);
    __syncthreads();
    const uint32_t base = *word;
    if (fits)
        for (uint32_t j = tid; j < total && base + j < (uint32_t)DSA_FILTER_CAP; j += T) cand[base + j] = stage[j];
    __threadfence();
    __syncthreads();
}

// ORDER_FREE past the all-pools regime: the pools of the gathered keys >= thr (exactly the top k)
// listed in increasing pool index, a deterministic order without a sort. Per pass over a span of
// 32 * WORDS pools: a bitmap in `bits` (WORDS = 2 * NSORT words, the slots candidates never use),
// one bit set per selected pool of the span, then each thread takes WORDS / blockDim.x words
// (thread 0 the highest), the suffix sum over the threads above gives the count of lower pools, and
// the thread writes its pools in order into list (at most TOPK_POOLS entries: the histogram's
// words, free after the radix select). `placed` carries the count across passes (one pass up to
// 32768 pools, four at the seed's 524288-token cache).
template <int NSORT>
__device__ __forceinline__ void dsa_list_in_index_order(const unsigned long long* cand, int m, unsigned long long thr,
                                                        int n, uint32_t* bits, int32_t* list, uint32_t* placed,
                                                        uint32_t* wsum) {
    constexpr int WORDS = 2 * NSORT, SPAN = 32 * WORDS;
    const int tid = threadIdx.x, nt = blockDim.x, wpt = WORDS / nt;
    if (tid == 0) *placed = 0;
    for (int lo = 0; lo < n; lo += SPAN) {
        for (int w = tid; w < WORDS; w += nt) bits[w] = 0;
        __syncthreads();   // the bitmap is clear; `placed` is current
        const uint32_t before = *placed;
        for (int i = tid; i < m; i += nt) {
            const unsigned long long x = cand[i];
            const int idx = dsa_rank_index(x) - lo;
            if (x >= thr && idx >= 0 && idx < SPAN) atomicOr(&bits[idx >> 5], 1u << (idx & 31));
        }
        __syncthreads();
        const int w0 = (nt - 1 - tid) * wpt;   // thread 0 holds the highest words
        uint32_t c = 0;
        for (int j = 0; j < wpt; ++j) c += __popc(bits[w0 + j]);
        const uint32_t below = dsa_block_suffix(c, wsum);   // the threads above hold the lower pools
        uint32_t pos = before + below;
        for (int j = 0; j < wpt; ++j) {
            for (uint32_t v = bits[w0 + j]; v != 0; v &= v - 1)
                list[pos++] = lo + 32 * (w0 + j) + (__ffs(v) - 1);
        }
        if (tid == 0) *placed = before + below + c;   // every read of `placed` this pass came before the suffix
        __syncthreads();   // every thread has read its words before the next pass clears them
    }
}

// The CTA's share of phase 1: the valid pools cut into gridDim.x ranges of whole CH-pool chunks.
template <int CH>
__device__ __forceinline__ int dsa_cta_pools(int n) {
    const int per = (n + (int)gridDim.x - 1) / (int)gridDim.x;
    return max(CH, (per + CH - 1) / CH * CH);
}
template <int CH>
__device__ __forceinline__ int dsa_cta_begin(int n) { return min(n, (int)blockIdx.x * dsa_cta_pools<CH>(n)); }

template <int H, int D, int KP, int TOPK_POOLS, bool FP8, int BITS, bool QROT, bool MMA, bool ORDER_FREE>
__device__ __forceinline__ void dsa_index_select_body(
    const float* q, const float* raw_w, const float* pool_keys,
    const uint8_t* pool_codes, const float* pool_scales,
    const int32_t* seq_len, const int32_t* tau, float* scores,
    uint32_t* ghist, uint32_t* arrive, unsigned long long* cand, int32_t* sel_tokens) {
    constexpr int T = DSA_SELECT_THREADS, CH = DSA_SELECT_CHUNK, BINS = 1 << BITS;
    constexpr int NHG = (H + dsa_heads_per_warp(H) - 1) / dsa_heads_per_warp(H);
    constexpr int NSORT = T, CAND = DSA_SELECT_RANK_SLOTS - NSORT;
    static_assert(D % 32 == 0 && D <= 128, "lane-strided channels, staged 32 pools at a time");
    static_assert(!FP8 || (D & (D - 1)) == 0, "the rotation needs a power-of-two width");
    static_assert(!QROT || FP8, "the rotated query scores the FP8 codes");
    static_assert(!MMA || !FP8, "the MMA form scores the FP32 cache");
    static_assert(H >= 1 && NHG <= DSA_SELECT_WARPS, "at most 128 heads");
    static_assert(TOPK_POOLS >= 1 && TOPK_POOLS <= NSORT, "the selection is sorted one key per thread");
    static_assert(BITS >= 9 && BITS <= 16 && BINS % T == 0, "first-digit bins");
    using Smem = DsaSelectSmem<H, D, FP8, BITS, MMA>;
    static_assert(sizeof(Smem) <= 48 * 1024, "static shared memory");
    __shared__ Smem sm;
    const int tid = threadIdx.x;
    // SEQ and POS are uploaded before the step's first kernel: safe to read before the wait.
    const int s_len = seq_len[0], t_pos = tau[0];
    const int n = dsa_valid_pools(s_len, t_pos, KP), k = dsa_topk_count(s_len, t_pos, KP, TOPK_POOLS);
    if (ORDER_FREE && dsa_every_pool_selected(s_len, t_pos, KP, TOPK_POOLS)) {   // the set needs no score
        ::kbp::pdl_launch_dependents();
        ::kbp::pdl_wait();        // sel_tokens' bytes may still be read by an earlier kernel
        if (blockIdx.x == 0) dsa_expand<KP, TOPK_POOLS>([](int r) { return r; }, k, s_len, t_pos, sel_tokens);
        return;
    }
    const int begin = dsa_cta_begin<CH>(n), end = min(n, begin + dsa_cta_pools<CH>(n));
    constexpr int ROW = FP8 ? D : D * 4;   // bytes per pool row
    const char* rows = FP8 ? (const char*)pool_codes : (const char*)pool_keys;
    if (begin < end)   // the older pools are history (the newest is staged after the wait)
        prefetch_l2(rows + (size_t)begin * ROW, (size_t)(end - begin) * ROW, tid, T);
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();
    KBP_STAMP(kStampWaitOut);

    for (int b = tid; b < BINS; b += T) sm.hist[b] = 0;
    if constexpr (MMA) {
        dsa_mma_stage_queries<H, D, T>(sm.p1, q, raw_w);
        __syncthreads();
        dsa_mma_score_tiles<H, D, BITS, DSA_SELECT_WARPS>(sm.p1, pool_keys, begin, end, scores, sm.hist);
        __syncthreads();
    } else {
        dsa_score_chunks<H, D, BITS, FP8, QROT>(sm.p1, sm.hist, q, raw_w, rows, pool_scales, begin, end, scores);
    }
    KBP_STAMP(3);   // phase 1 scored (thread 0's share)
    for (int b = tid; b < BINS; b += T)
        if (sm.hist[b]) atomicAdd(&ghist[b], sm.hist[b]);
    __threadfence();
    __syncthreads();
    const bool filter = cand != nullptr && k > 0 && n > DSA_FILTER_MIN_POOLS;   // uniform over the grid
    if (filter) {   // the CTA's range again (cheaper than keeping it live through phase 1)
        const int first = dsa_cta_begin<CH>(n), last = min(n, first + dsa_cta_pools<CH>(n));
        dsa_filter_candidates<BITS>(sm.hist, ghist, scores, first, last, (uint32_t)k, sm.rank, cand, arrive + 1,
                                    sm.wsum, &sm.digit, &sm.count2);
    }
    KBP_STAMP(4);   // histogram added (and the candidates listed)
    if (tid == 0) sm.last = atomicAdd(arrive, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!sm.last) return;
    __threadfence();   // acquire: every CTA's scores and histogram counts are visible

    // ---- phase 2: the last CTA selects and expands ----
    const uint32_t listed = filter ? __ldcg(arrive + 1) : 0u;   // candidates the CTAs listed
    if (tid == 0) { arrive[0] = 0; sm.count = 0; }
    for (int b = tid; b < BINS; b += T) sm.hist[b] = atomicExch(&ghist[b], 0u);
    __syncthreads();
    if (filter && tid == 0) arrive[1] = 0;   // every thread has read it (the barrier above)
    unsigned long long pick = 0;   // this thread's slot of the sorted selection
    unsigned long long thr = 1;    // the selection: every gathered key >= thr
    if (k > 0) {
        constexpr int BPT = BINS / T;   // thread t owns bins [t BPT, t BPT + BPT)
        uint32_t local = 0;
#pragma unroll
        for (int b = 0; b < BPT; ++b) local += sm.hist[tid * BPT + b];
        uint32_t above = dsa_block_suffix(local, sm.wsum);
        for (int b = BPT - 1; b >= 0; --b) {
            const uint32_t c = sm.hist[tid * BPT + b];
            if (above < (uint32_t)k && above + c >= (uint32_t)k) { sm.bin = tid * BPT + b; sm.n_gt = above; }
            above += c;
        }
        __syncthreads();
        const uint32_t bin = sm.bin, n_gt = sm.n_gt, need = (uint32_t)k - n_gt;
        const bool fits = n_gt + sm.hist[bin] <= (uint32_t)CAND;
        // Keys in the bins above `bin` (and in it when they fit) are exactly the scores >= its floor;
        // the filter's list holds all of them (its cut is at most `bin`) unless it overflowed.
        const uint32_t from = fits ? bin : bin + 1;
        if (filter && listed <= (uint32_t)DSA_FILTER_CAP) {
            for (uint32_t i = tid; i < listed; i += T) {
                const unsigned long long x = __ldcg(cand + i);
                if ((uint32_t)(x >> (64 - BITS)) >= from) sm.rank[dsa_append_slot(&sm.count)] = x;
            }
        } else {
            dsa_for_each_score(scores, n, dsa_bin_floor<BITS>(from), [&](float s, int i) {
                sm.rank[dsa_append_slot(&sm.count)] = dsa_rank_key(s, i);
            });
        }
        __syncthreads();
        if (fits) {
            const int m = (int)sm.count;
            if (m > k)
                thr = dsa_radix_select([&](auto fn) { for (int i = tid; i < m; i += T) fn(sm.rank[i]); },
                                       0ull, 64, (uint32_t)k, sm.hist, &sm.digit, &sm.above);
        } else {   // the bin overflows shared memory: select inside it over the scores in memory
            auto in_bin = [&](auto fn) {
                dsa_for_each_score(scores, n, dsa_bin_floor<BITS>(bin), [&](float s, int i) {
                    if (dsa_score_key(s) >> (32 - BITS) == bin) fn(dsa_rank_key(s, i));
                });
            };
            const unsigned long long t_in = dsa_radix_select(in_bin, (unsigned long long)bin << (64 - BITS),
                                                             64 - BITS, need, sm.hist, &sm.digit, &sm.above);
            in_bin([&](unsigned long long x) { if (x >= t_in) sm.rank[dsa_append_slot(&sm.count)] = x; });
            __syncthreads();
        }
        KBP_STAMP(5);   // last CTA: the bin picked, its keys gathered and the threshold selected
        if constexpr (ORDER_FREE) {   // the set in index order: no compaction, no sort
            dsa_list_in_index_order<NSORT>(sm.rank, (int)sm.count, thr, n, reinterpret_cast<uint32_t*>(sm.rank + CAND),
                                           reinterpret_cast<int32_t*>(sm.hist), &sm.count2, sm.wsum);
        }
    }
    if constexpr (ORDER_FREE) {
        __syncthreads();
        KBP_STAMP(6);   // last CTA: the selection listed, before the expansion
        const int32_t* list = reinterpret_cast<const int32_t*>(sm.hist);
        dsa_expand<KP, TOPK_POOLS>([&](int r) { return list[r]; }, k, s_len, t_pos, sel_tokens);
        return;
    }
    if (k > 0) {
        // Compact the k selected keys (any order) into the top NSORT slots, which candidates never use.
        unsigned long long* out = sm.rank + CAND;
        out[tid] = 0ull;
        if (tid == 0) sm.count2 = 0;
        __syncthreads();
        const int m = (int)sm.count;
        for (int i = tid; i < m; i += T) {
            const unsigned long long x = sm.rank[i];
            if (x >= thr) out[dsa_append_slot(&sm.count2)] = x;
        }
        __syncthreads();
        pick = out[tid];
    }
    unsigned long long* sorted = sm.rank + CAND;
    pick = dsa_bitonic_desc(pick, sorted);
    __syncthreads();
    sorted[tid] = pick;
    __syncthreads();
    KBP_STAMP(6);   // last CTA: the selection sorted, before the expansion
    dsa_expand<KP, TOPK_POOLS>([&](int r) { return dsa_rank_index(sorted[r]); }, k, s_len, t_pos, sel_tokens);
}

template <int H, int D, int KP, int TOPK_POOLS, bool FP8, int BITS, bool QROT, bool MMA, bool ORDER_FREE>
__global__ void __launch_bounds__(DSA_SELECT_THREADS, 1) dsa_index_select(
    const float* q, const float* raw_w, const float* pool_keys,
    const uint8_t* pool_codes, const float* pool_scales,
    const int32_t* seq_len, const int32_t* tau, float* scores,
    uint32_t* hist, uint32_t* arrive, unsigned long long* cand, int32_t* sel_tokens) {
    KBP_STAMP_BEGIN();   // stamps of a profiling build (kbp_stamps.cuh): 3-6 in the body
    dsa_index_select_body<H, D, KP, TOPK_POOLS, FP8, BITS, QROT, MMA, ORDER_FREE>(q, raw_w, pool_keys, pool_codes, pool_scales, seq_len,
                                                           tau, scores, hist, arrive, cand, sel_tokens);
    KBP_STAMP_END();
}

}  // namespace kbp
