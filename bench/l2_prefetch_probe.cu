// l2_prefetch_probe.cu: does a weight stream that follows a latency-bound kernel get faster if its
// CTAs, resident early under programmatic dependent launch, first ask for part of their weights to
// be brought into L2 (before griddepcontrol.wait), so that DRAM works while the kernel before them
// runs? Compares the bulk form (cp.async.bulk.prefetch.L2: one instruction per contiguous range,
// issued by one thread) with the per-line form (prefetch.global.L2: one instruction per 128 bytes,
// what kbp::prefetch_l2 issues), at several shares of each CTA's tile, behind a one-CTA kernel
// that holds the dependency for T us.
//
// Shape: tiles of 16 rows x ROW bytes (the DSA output projection: ROW 16384, 256 tiles, 67 MB; the
// KDA output projection: ROW 4096 + its scales, 256 tiles, 19 MB), one tile a CTA of 256 threads,
// two CTAs an SM (one wave). Every measured sequence starts from an L2 emptied by reading a 256 MB
// buffer (reading, not writing: dirty lines would cost write-backs that a step's L2 does not hold).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/l2_prefetch_probe.cu -o /tmp/l2probe
//   /tmp/l2probe [--json OUT.json]
// Prints, per case, the time from the holding kernel's start to the stream's end (CUDA events,
// median of REPS sequences) and the stream's effective bandwidth after the hold.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                 \
        }                                                                                 \
    } while (0)

constexpr int kThreads = 256;

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// The latency-bound kernel before the stream: one CTA that releases its dependents at once and
// then holds the dependency for `ns` nanoseconds.
__global__ void hold(unsigned long long ns, int* sink) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < ns) {
    }
    if (threadIdx.x == 0) sink[0] = 1;
}

// Reads `n` uint4 of a buffer larger than L2, so the stream's weights start in DRAM.
__global__ void flush_l2(const uint4* p, size_t n, unsigned* out) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) out[0] = acc;
}

enum Mode { kNone = 0, kBulk = 1, kLine = 2, kLoad = 3, kWarm = 4 };

// One tile a CTA: prefetch the first `pf` bytes of the tile into L2 (mode), wait for the kernel
// before, then read the whole tile (16-byte non-coherent loads, 8 in flight a thread).
__global__ void __launch_bounds__(kThreads, 2) stream(const uint4* w, size_t tile_bytes, size_t pf, int mode,
                                                      unsigned* out) {
    const char* tile = reinterpret_cast<const char*>(w) + (size_t)blockIdx.x * tile_bytes;
    if (mode == kBulk && threadIdx.x == 0) {
        constexpr size_t kChunk = 64 << 10;   // one instruction a 64 KB range
        for (size_t off = 0; off < pf; off += kChunk) {
            const unsigned size = (unsigned)(pf - off < kChunk ? pf - off : kChunk);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(tile + off), "r"(size) : "memory");
        }
    } else if (mode == kLine) {
        for (size_t off = (size_t)threadIdx.x * 128; off < pf; off += (size_t)kThreads * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(tile + off));
    } else if (mode == kLoad) {   // plain L2-only loads whose values are dropped (one 4-byte word a line)
        unsigned a = 0;
        for (size_t off = (size_t)threadIdx.x * 128; off < pf; off += (size_t)kThreads * 128)
            a ^= __ldcg(reinterpret_cast<const unsigned*>(tile + off));
        if (a == 0x9e3779b9u) out[blockIdx.x] = a;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const uint4* t4 = reinterpret_cast<const uint4*>(tile);
    const size_t n = tile_bytes / 16;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i < n; i += 8 * kThreads) {
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = i + j * kThreads < n ? __ldg(t4 + i + j * kThreads) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;   // keeps the loads; never true for these bytes
}

struct Case {
    const char* shape;
    size_t tile_bytes;
    int tiles;
    double hold_us;
    double share;
    int mode;
};

int main(int argc, char** argv) {
    const char* json = nullptr;
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
    const int reps = 30;
    const size_t flush_bytes = 256u << 20;
    size_t max_bytes = 0;
    std::vector<Case> cases;
    struct Shape { const char* name; size_t tile; int tiles; };
    const Shape shapes[] = {{"dsa_o 67MB", 16 * 16384, 256}, {"kda_o 19MB", 16 * (2048 + 256), 256}};
    const double holds[] = {0.0, 10.0, 20.0};
    const double shares[] = {0.0, 0.5, 1.0};
    for (const Shape& s : shapes) {
        max_bytes = std::max(max_bytes, s.tile * s.tiles);
        for (double h : holds)
            for (double f : shares)
                for (int m : {kBulk, kLine, kLoad}) {
                    if (f == 0.0 && m != kBulk) continue;   // share 0 is the same run in every mode
                    cases.push_back({s.name, s.tile, s.tiles, h, f, f == 0.0 ? (int)kNone : m});
                }
        for (double h : holds) cases.push_back({s.name, s.tile, s.tiles, h, 0.0, kWarm});
    }
    void *w, *flush;
    unsigned* out;
    int* sink;
    CHECK(cudaMalloc(&w, max_bytes));
    CHECK(cudaMalloc(&flush, flush_bytes));
    CHECK(cudaMalloc(&out, 4096 * sizeof(unsigned)));
    CHECK(cudaMalloc(&sink, sizeof(int)));
    CHECK(cudaMemset(w, 0x5a, max_bytes));
    CHECK(cudaMemset(flush, 0x33, flush_bytes));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    cudaLaunchAttribute pdl[1];
    pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl[0].val.programmaticStreamSerializationAllowed = 1;
    FILE* js = json ? std::fopen(json, "w") : nullptr;
    if (js) std::fprintf(js, "[\n");
    std::printf("%-11s %7s %6s %5s %10s %12s\n", "shape", "hold_us", "share", "mode", "total_us", "after_hold");
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& c = cases[ci];
        const size_t pf = (size_t)(c.share * (double)c.tile_bytes) / 4096 * 4096;
        std::vector<float> t(reps);
        for (int r = 0; r < reps; ++r) {
            if (c.mode == kWarm)   // the stream's bytes left in L2 by the same stream just before
                stream<<<c.tiles, kThreads, 0, st>>>((const uint4*)w, c.tile_bytes, 0, kNone, out);
            else
                flush_l2<<<1056, 256, 0, st>>>((const uint4*)flush, flush_bytes / 16, out);
            CHECK(cudaEventRecord(e0, st));
            hold<<<1, 32, 0, st>>>((unsigned long long)(c.hold_us * 1000.0), sink);
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(c.tiles);
            cfg.blockDim = dim3(kThreads);
            cfg.stream = st;
            cfg.attrs = pdl;
            cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, stream, (const uint4*)w, c.tile_bytes, pf, c.mode == kWarm ? (int)kNone : c.mode, out));
            CHECK(cudaEventRecord(e1, st));
            CHECK(cudaEventSynchronize(e1));
            CHECK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        std::sort(t.begin(), t.end());
        const double us = 1000.0 * t[reps / 2];
        const double bytes = (double)c.tile_bytes * c.tiles;
        const double after = us - c.hold_us;
        const char* names[] = {"none", "bulk", "line", "load", "warm"};
        const char* mode = names[c.mode];
        std::printf("%-11s %7.1f %6.2f %5s %10.2f %12.2f  (%.2f TB/s after the hold)\n", c.shape, c.hold_us, c.share,
                    mode, us, after, bytes / (after * 1e-6) / 1e12);
        if (js)
            std::fprintf(js, "  {\"shape\": \"%s\", \"bytes\": %.0f, \"hold_us\": %.1f, \"share\": %.2f, \"mode\": \"%s\", "
                             "\"total_us\": %.3f, \"min_us\": %.3f}%s\n",
                         c.shape, bytes, c.hold_us, c.share, mode, us, 1000.0 * t[0], ci + 1 < cases.size() ? "," : "");
    }
    if (js) {
        std::fprintf(js, "]\n");
        std::fclose(js);
    }
    return 0;
}
