// embed_copy.cuh: embedding row copy for a token id read from device memory
// (explain.families.embed_copy). The engine's form is one device-to-device copy per row; this is
// the same copy as a tiny kernel, so the id can come from the previous step's device memory and
// the copy can live inside the step's CUDA graph.
//
// Launch contract
//   kbp::embed_copy<D, VEC>(tokens, table, vocab, out, error_flag)
//     tokens [m] int32 (device), table [vocab][D] BF16, out [m][D] BF16, error_flag int32 or
//     nullptr. grid (ceil(D / (block*VEC)), m), any block size; D % VEC == 0, table and out rows
//     2*VEC-byte aligned (VEC = 8: 16-byte copies).
//     A token id outside [0, vocab) reads nothing: its row is written as zeros and *error_flag is
//     set to 1 (never cleared here), so the runner can raise the error the reference raises.
// Math: out_t = table[tokens_t] byte for byte (no widening, no rounding).
#pragma once

#include <stdint.h>
#include "kbp_common.cuh"

namespace kbp {

template <int VEC>
struct alignas(2 * VEC) EmbedWords { uint16_t v[VEC]; };

template <int D, int VEC>
__device__ __forceinline__ void embed_copy_body(const int* tokens, const uint16_t* table,
                                                int vocab, uint16_t* out, int* error_flag) {
    static_assert(D % VEC == 0 && (VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8), "VEC");
    const int i0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= D) return;
    const size_t t = blockIdx.y;
    const int tok = tokens[t];
    EmbedWords<VEC> w;
    if (tok >= 0 && tok < vocab) {
        w = *reinterpret_cast<const EmbedWords<VEC>*>(table + (size_t)tok * D + i0);
    } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) w.v[v] = 0;
        if (error_flag != nullptr && i0 == 0) *error_flag = 1;
    }
    *reinterpret_cast<EmbedWords<VEC>*>(out + t * D + i0) = w;
}

template <int D, int VEC>
__global__ void embed_copy(const int* tokens, const uint16_t* table, int vocab,
                           uint16_t* out, int* error_flag) {
    KBP_STAMP_BEGIN();   // phase stamps of a profiling build (kbp_stamps.cuh): begin, the wait, end
    ::kbp::pdl_launch_dependents();  // early: the next kernel may take free SMs now (it waits in pdl_wait)
    KBP_STAMP(kStampWaitIn);
    ::kbp::pdl_wait();   // PDL: nothing below runs before the previous kernel completes
    KBP_STAMP(kStampWaitOut);
    embed_copy_body<D, VEC>(tokens, table, vocab, out, error_flag);
    KBP_STAMP_END();
}

}  // namespace kbp
