// kbp_synthetic.cu: `synthetic:SEED` weights generated on the GPU, bit for bit the values of
// kbpc/weights/synthetic.py (see its docstring for the generator), so a large model needs no host
// copy. The host computes each tensor's key (fnv1a64 of its name mixed with the seed) and rule.
#include <cuda_bf16.h>
#include <stdint.h>

#include "kbp_runtime.h"

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// kind: 0 uniform, 1 E2M1 code bytes, 2 E4M3 block-scale codes, 3 signed E4M3 weight codes.
// storage: 0 f32, 1 bf16 bits, 2 uint8.
__global__ void fill_synthetic(void* dst, unsigned long long count, unsigned long long key, int kind,
                               float scale, float offset, int lo, int hi, int storage) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count; i += stride) {
        const uint64_t h = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
        if (kind == 0) {
            const float unit = __fsub_rn(__fmul_rn((float)(h >> 40), 1.0f / 8388608.0f), 1.0f);
            const float v = __fadd_rn(__fmul_rn(unit, scale), offset);
            if (storage == 0) ((float*)dst)[i] = v;
            else ((__nv_bfloat16*)dst)[i] = __float2bfloat16_rn(v);
        } else if (kind == 1) {
            ((uint8_t*)dst)[i] = (uint8_t)(h & 0xFF);
        } else {
            const uint8_t mag = (uint8_t)(lo + h % (uint64_t)(hi - lo + 1));
            const uint8_t sign = kind == 3 ? (uint8_t)((h >> 8) & 0x80) : 0;
            ((uint8_t*)dst)[i] = mag | sign;
        }
    }
}

}  // namespace

extern "C" int kbp_fill_synthetic(void* dst, unsigned long long count, unsigned long long key, int kind,
                                  float scale, float offset, int lo, int hi, int storage) {
    if (count == 0) return 0;
    const int threads = 256;
    unsigned long long blocks = (count + threads - 1) / threads;
    if (blocks > 65535ull * 8) blocks = 65535ull * 8;
    fill_synthetic<<<(unsigned)blocks, threads>>>(dst, count, key, kind, scale, offset, lo, hi, storage);
    cudaError_t e = cudaDeviceSynchronize();
    return (int)e;
}
