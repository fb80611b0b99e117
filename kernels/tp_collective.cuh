// tp_collective.cuh: device code the tensor-parallel split adds to a rank's step.
//
// Launch contract:
//   own_experts<int>(ids, n, base, count): grid (ceil(n / blockDim.x)), any block. Rewrites the n routed
//     expert ids of an expert-parallel MoE block in place: an id of this rank's experts
//     [base, base + count) becomes its local index id - base, any other id (and -1) becomes -1,
//     an empty slot, which the expert kernels fill with +0 and the combine reads as such.
// Math (kbpc.reference.tensor_parallel.rank_handlers): local = base <= id < base + count ? id - base : -1.
// The partial sums themselves are not here: the post-mix kernels (glm_mhc.cuh, RankParts<R>) add
// the all-gathered partials in rank order.
#pragma once

#include "kbp_common.cuh"

namespace kbp {
namespace tp {

// A template (instantiated for int ids) so that every TU including this header may define it.
template <typename Id>
__global__ void own_experts(Id* ids, int n, int base, int count) {
    ::kbp::pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const Id e = ids[i];
    ids[i] = (e >= base && e < base + count) ? e - base : -1;
}

}  // namespace tp
}  // namespace kbp
