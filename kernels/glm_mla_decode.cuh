// glm_mla_decode.cuh: sparse NoPE MLA decode over the paged FP8 latent cache (absorbed form).
//
// Launch contract
//   glm_mla_decode_fp8<E, WARPS, G><<<dim3(H, rows), 32 * WARPS>>>(
//       q, cache, block_table, page_size, sel, width, seq_len, s_k, out)
//   q            const __nv_bfloat16 [rows][H][E]  absorbed queries (16-byte aligned rows)
//   cache        const uint8_t [num_pages][P][E]   E4M3 latent rows (glm_mla_latent_write.cuh)
//   block_table  const int32_t [logical pages]     physical page of each logical page
//   page_size    P (tokens per page)
//   sel          const int32_t [rows][width]       token ids from dsa_indexer.cuh; -1 and ids
//                                                  outside [0, seq_len[0]) are skipped,
//                                                  duplicates attended twice
//   seq_len      const int32_t [1]                 S, read on the device (graph-replay safe)
//   s_k          float                             static cache scale
//   out          __nv_bfloat16 [rows][H][E]
//   E a multiple of 512 (a lane owns 16-byte chunks); WARPS a power of two >= 2 (16 in the
//   blueprint); G entries per gather group (4). Static shared memory (WARPS/2)(E + 2) floats.
//
// Math (explain.families.glm_mla_decode; reference kbpc/reference/glm_mla_decode.py, same order):
//   group g of G consecutive entries goes to warp g % WARPS; per token v = fl(s_k * e4m3(code)),
//   lane l sums fl(q_c v_c) over c = 16(l + 32i) + k sequentially, xor butterfly, z = fl(dot *
//   fl(1/sqrtf(E))); online update token by token (m' = max(m, z), a = __expf(m - m'),
//   p = __expf(z - m'), l = l a + p, o = o a + p v; a = 1 skipped when m' = m, same bits);
//   warps merged by a halving tree (warp w absorbs warp w + stride); out = rn_bf16(o / l), zeros
//   when no token is valid.
// Each kernel NAME is a thin __global__ over NAME_body (a __device__ function), so a translation
// unit may wrap the body in an extern "C" kernel with the same launch bounds.
#pragma once

#include "kbp_common.cuh"

namespace kbp {

template <int CH>
struct MlaLaneState {
    float m, l;
    float o[CH][16];
};

// 16 E4M3 codes (one uint4) -> 16 FP32 values times s_k.
__device__ __forceinline__ void mla_decode16(const uint4 raw, float s_k, float (&v)[16]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(
                (__nv_fp8x2_storage_t)((w[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
            const float2 f = __half22float2(__half2(hr));
            v[4 * i + 2 * h] = f.x * s_k;
            v[4 * i + 2 * h + 1] = f.y * s_k;
        }
    }
}

template <int CH>
__device__ __forceinline__ void mla_attend_token(const uint4 (&raw)[CH], const float (&qf)[CH][16],
                                                 float s_k, float scale, MlaLaneState<CH>& st) {
    float v[CH][16];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        mla_decode16(raw[i], s_k, v[i]);
#pragma unroll
        for (int k = 0; k < 16; ++k) {
            const float prod = qf[i][k] * v[i][k];
            acc = (i == 0 && k == 0) ? prod : acc + prod;
        }
    }
    const float z = warp_sum_xor(acc) * scale;  // every lane holds the same z
    if (z > st.m) {
        const float a = kbp::exp_f32(st.m - z);  // 0 for the first token (m = -inf)
        const float p = kbp::exp_f32(z - z);
        st.l = st.l * a + p;
#pragma unroll
        for (int i = 0; i < CH; ++i)
#pragma unroll
            for (int k = 0; k < 16; ++k) st.o[i][k] = st.o[i][k] * a + p * v[i][k];
        st.m = z;
    } else {
        const float p = kbp::exp_f32(z - st.m);
        st.l = st.l + p;
#pragma unroll
        for (int i = 0; i < CH; ++i)
#pragma unroll
            for (int k = 0; k < 16; ++k) st.o[i][k] = st.o[i][k] + p * v[i][k];
    }
}

// Gather the G entries of group g (lane's chunks); invalid entries get row -1.
template <int E, int G, int CH>
__device__ __forceinline__ void mla_gather(const int32_t* __restrict__ sel, int width, int g, int seq_len,
                                           const int32_t* __restrict__ block_table, int page_size,
                                           const uint8_t* __restrict__ cache, int lane,
                                           long long (&row)[G], uint4 (&raw)[G][CH]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const int e = g * G + j;
        const int id = e < width ? sel[e] : -1;
        row[j] = -1;
        if (id >= 0 && id < seq_len) {
            row[j] = (long long)block_table[id / page_size] * page_size + id % page_size;
            const uint4* src = reinterpret_cast<const uint4*>(cache + row[j] * E);
#pragma unroll
            for (int i = 0; i < CH; ++i) raw[j][i] = __ldg(src + lane + 32 * i);
        }
    }
}

template <int E, int WARPS, int G>
__device__ __forceinline__ void glm_mla_decode_fp8_body(
    const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ cache,
    const int32_t* __restrict__ block_table, int page_size, const int32_t* __restrict__ sel, int width,
    const int32_t* __restrict__ seq_len_ptr, float s_k, __nv_bfloat16* __restrict__ out) {
    static_assert(E % 512 == 0, "a lane owns 16-byte chunks of 16 channels");
    static_assert(WARPS >= 2 && (WARPS & (WARPS - 1)) == 0, "halving merge tree");
    constexpr int CH = E / 512;
    __shared__ float sm_o[WARPS / 2][E];
    __shared__ float sm_m[WARPS / 2], sm_l[WARPS / 2];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x, H = gridDim.x, r = blockIdx.y;
    const int seq_len = seq_len_ptr[0];
    sel += (size_t)r * width;
    const size_t qoff = ((size_t)r * H + h) * E;

    float qf[CH][16];
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        const uint4* src = reinterpret_cast<const uint4*>(q + qoff) + 2 * (lane + 32 * i);
        const uint4 a = src[0], b = src[1];
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            qf[i][2 * k] = __uint_as_float(w[k] << 16);
            qf[i][2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
    const float scale = 1.0f / sqrtf((float)E);
    MlaLaneState<CH> st;
    st.m = -INFINITY;
    st.l = 0.0f;
#pragma unroll
    for (int i = 0; i < CH; ++i)
#pragma unroll
        for (int k = 0; k < 16; ++k) st.o[i][k] = 0.0f;

    const int groups = (width + G - 1) / G;
    long long row[G], row_n[G];
    uint4 raw[G][CH], raw_n[G][CH];
    if (warp < groups) mla_gather<E, G, CH>(sel, width, warp, seq_len, block_table, page_size, cache, lane, row, raw);
    for (int g = warp; g < groups; g += WARPS) {
        if (g + WARPS < groups)  // prefetch the warp's next group while this one is computed
            mla_gather<E, G, CH>(sel, width, g + WARPS, seq_len, block_table, page_size, cache, lane, row_n, raw_n);
#pragma unroll
        for (int j = 0; j < G; ++j)
            if (row[j] >= 0) mla_attend_token<CH>(raw[j], qf, s_k, scale, st);
#pragma unroll
        for (int j = 0; j < G; ++j) {
            row[j] = row_n[j];
#pragma unroll
            for (int i = 0; i < CH; ++i) raw[j][i] = raw_n[j][i];
        }
    }

    // Halving merge tree across warps through shared memory.
    for (int stride = WARPS / 2; stride >= 1; stride >>= 1) {
        if (warp >= stride && warp < 2 * stride) {
            const int slot = warp - stride;
            if (lane == 0) { sm_m[slot] = st.m; sm_l[slot] = st.l; }
#pragma unroll
            for (int i = 0; i < CH; ++i)
#pragma unroll
                for (int k = 0; k < 16; ++k) sm_o[slot][16 * (lane + 32 * i) + k] = st.o[i][k];
        }
        __syncthreads();
        if (warp < stride) {
            const float mb = sm_m[warp], lb = sm_l[warp];
            const float ms = fmaxf(st.m, mb);
            const float fa = st.m == -INFINITY ? 0.0f : kbp::exp_f32(st.m - ms);
            const float fb = mb == -INFINITY ? 0.0f : kbp::exp_f32(mb - ms);
            st.l = st.l * fa + lb * fb;
#pragma unroll
            for (int i = 0; i < CH; ++i)
#pragma unroll
                for (int k = 0; k < 16; ++k)
                    st.o[i][k] = st.o[i][k] * fa + sm_o[warp][16 * (lane + 32 * i) + k] * fb;
            st.m = ms;
        }
        __syncthreads();
    }
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
        uint32_t w[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float lo = st.l > 0.0f ? st.o[i][2 * k] / st.l : 0.0f;
            const float hi = st.l > 0.0f ? st.o[i][2 * k + 1] / st.l : 0.0f;
            w[k] = (uint32_t)__bfloat16_as_ushort(f32_to_bf16(lo)) |
                   ((uint32_t)__bfloat16_as_ushort(f32_to_bf16(hi)) << 16);
        }
        uint4* dst = reinterpret_cast<uint4*>(out + qoff) + 2 * (lane + 32 * i);
        dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
        dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    }
}

template <int E, int WARPS, int G>
__global__ void __launch_bounds__(32 * WARPS) glm_mla_decode_fp8(
    const __nv_bfloat16* __restrict__ q, const uint8_t* __restrict__ cache,
    const int32_t* __restrict__ block_table, int page_size, const int32_t* __restrict__ sel, int width,
    const int32_t* __restrict__ seq_len_ptr, float s_k, __nv_bfloat16* __restrict__ out) {
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    glm_mla_decode_fp8_body<E, WARPS, G>(q, cache, block_table, page_size, sel, width, seq_len_ptr, s_k, out);
}

}  // namespace kbp
