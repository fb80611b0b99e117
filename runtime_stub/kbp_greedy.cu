// kbp_greedy.cu: the greedy token on the GPU, so a decode step reads back 8 bytes instead of the
// whole BF16 logits row (154880 logits of the seed: a 310 KB copy and ~0.2 ms of host scan a step).
//
// Math: argmax_host's (explain.families.argmax_host, kbpc/reference/argmax_host.py), bit for bit:
// yhat = the first index of the maximum, a NaN logit never chosen, and index 0 when no logit
// exceeds -inf. Every logit becomes a 64-bit key whose order is the scan's: the high word is the
// logit's FP32 bits made monotone (NaN taken as -inf, -0 as +0, since the scan's > does not tell
// -0 from +0), the low word 0xffffffff - i, so among equal logits the lowest index has the largest
// key. The largest key is then the scan's answer whatever order the keys are combined in. Logits
// that are infinite or NaN are counted, for the runner's refusal of a non-finite step.
//
// Method: a grid-stride pass, one key a CTA (shuffles, then shared memory), the per-CTA keys and
// counts written to scratch; the last CTA to arrive (counter reset for the next launch) combines
// them and writes {token, nonfinite}. No CTA waits for another.
#include <stddef.h>
#include <stdint.h>

#include "kbp_runtime.h"

namespace {

constexpr int kThreads = 256;

struct GreedyScratch {
    unsigned long long key[KBP_GREEDY_MAX_CTAS];
    int nonfinite[KBP_GREEDY_MAX_CTAS];
    unsigned arrived;
    int out[2];   // token, non-finite logits
};
static_assert(sizeof(GreedyScratch) <= KBP_GREEDY_SCRATCH_BYTES, "scratch size");

__device__ __forceinline__ unsigned long long greedy_key(uint16_t bits, unsigned i) {
    unsigned u = (unsigned)bits << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u) u = 0xff800000u;   // NaN: never above -inf
    if (u == 0x80000000u) u = 0u;                            // -0 ties with +0
    const unsigned ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)ord << 32) | (0xffffffffu - i);
}

__device__ __forceinline__ unsigned long long max_u64(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

__global__ void __launch_bounds__(kThreads)
greedy_bf16(const uint16_t* logits, int vocab, GreedyScratch* s) {
    __shared__ unsigned long long warp_key[kThreads / 32];
    __shared__ int warp_bad[kThreads / 32];
    __shared__ bool last;
    unsigned long long key = 0;   // below every logit's key (a -inf logit's high word is 0x007fffff)
    int bad = 0;
    const int stride = gridDim.x * kThreads;
#pragma unroll 4
    for (int i = blockIdx.x * kThreads + threadIdx.x; i < vocab; i += stride) {
        const uint16_t b = __ldcg(logits + i);
        key = max_u64(key, greedy_key(b, (unsigned)i));
        bad += (b & 0x7f80u) == 0x7f80u;
    }
    for (int o = 16; o > 0; o >>= 1) {
        key = max_u64(key, __shfl_xor_sync(0xffffffffu, key, o));
        bad += __shfl_xor_sync(0xffffffffu, bad, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { warp_key[warp] = key; warp_bad[warp] = bad; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kThreads / 32; ++w) { key = max_u64(key, warp_key[w]); bad += warp_bad[w]; }
        s->key[blockIdx.x] = key;
        s->nonfinite[blockIdx.x] = bad;
        __threadfence();
        last = atomicAdd(&s->arrived, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    for (unsigned c = 0; c < gridDim.x; ++c) { key = max_u64(key, __ldcg(&s->key[c])); }
    bad = 0;
    for (unsigned c = 0; c < gridDim.x; ++c) bad += __ldcg(&s->nonfinite[c]);
    s->out[0] = (int)(0xffffffffu - (unsigned)(key & 0xffffffffu));
    s->out[1] = bad;
    s->arrived = 0u;   // the next launch starts from zero
}

}  // namespace

extern "C" cudaError_t kbp_greedy_enqueue(const void* logits, int vocab, void* scratch, cudaStream_t stream) {
    if (vocab <= 0) return cudaErrorInvalidValue;
    int ctas = (vocab + kThreads * 4 - 1) / (kThreads * 4);   // about four logits a thread
    ctas = ctas < 1 ? 1 : (ctas > KBP_GREEDY_MAX_CTAS ? KBP_GREEDY_MAX_CTAS : ctas);
    greedy_bf16<<<ctas, kThreads, 0, stream>>>((const uint16_t*)logits, vocab, (GreedyScratch*)scratch);
    return cudaGetLastError();
}

extern "C" size_t kbp_greedy_result_offset(void) { return offsetof(GreedyScratch, out); }
