// handoff_latency.cu: how long a dependent kernel waits after the kernel before it has done its
// work, inside a replayed CUDA graph, for the hand-offs a decode step can use. Standalone (no kbpc
// import): nvcc -O3 -std=c++17 -arch=sm_90 -o handoff bench/handoff_latency.cu && ./handoff
// prints one JSON object. Why: the step is a chain of ~650 latency-bound launches, so the time
// from "a kernel's last CTA is done" to "the next kernel's CTAs may read its output" is paid on
// nearly every edge; this measures it apart from any real kernel's work.
//
// A graph holds CHAIN launches of one kernel on one stream, each with GRID CTAs of 256 threads.
// Every CTA first (optionally) releases its dependents, then waits for the kernel before it in the
// mode's way, records %globaltimer (the CTA's "go" time), busy-waits WORK_NS, and records its "done"
// time; in the flag mode it then arrives (fence + atomic add on the kernel's counter). Hand-off i =
// min over kernel i+1's CTAs of go - max over kernel i's CTAs of done: from the last CTA's work done
// to the first dependent CTA allowed to read it.
// Modes:
//   plain   no PDL attribute: stream order (the kernel launches when the one before completes)
//   pdl     PDL attribute, griddepcontrol.launch_dependents first, griddepcontrol.wait (what every
//           kbpc kernel does): returns once the previous grid has completed and flushed
//   pdl_end PDL attribute, no early release (dependents launch as the CTAs exit), griddepcontrol.wait
//   flag    PDL attribute and early release, but no griddepcontrol.wait: thread 0 spins with
//           ld.acquire.gpu on the previous kernel's arrival counter until all its CTAs arrived
//           (each CTA: __syncthreads, then thread 0: __threadfence + atomicAdd), then __syncthreads
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "bench_cuda.cuh"

enum Mode { kPlain = 0, kPdl = 1, kPdlEnd = 2, kFlag = 3 };
static const char* kModeNames[] = {"plain", "pdl", "pdl_end", "flag"};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// go[i] / done[i]: min of the CTAs' go times, max of their done times (kernel i of the chain).
__global__ void __launch_bounds__(256) link(int mode, int i, unsigned long long work_ns, unsigned long long* go,
                                            unsigned long long* done, unsigned* counters, int grid) {
    if (mode == kPdl || mode == kFlag) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (mode == kPdl || mode == kPdlEnd) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (mode == kFlag && i > 0) {
        if (threadIdx.x == 0)
            while (ld_acquire(counters + i - 1) < (unsigned)grid) {
            }
        __syncthreads();
    }
    const unsigned long long t0 = gtime();
    if (threadIdx.x == 0) atomicMin(go + i, t0);
    while (gtime() - t0 < work_ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicMax(done + i, gtime());
        if (mode == kFlag) {
            __threadfence();
            atomicAdd(counters + i, 1u);
        }
    }
}

struct Result {
    double median_ns, p10_ns, p90_ns;
};

static Result run_mode(int mode, int grid, int chain, unsigned long long work_ns, int replays) {
    unsigned long long *go, *done;
    unsigned* counters;
    CK(cudaMalloc(&go, chain * sizeof(unsigned long long)));
    CK(cudaMalloc(&done, chain * sizeof(unsigned long long)));
    CK(cudaMalloc(&counters, chain * sizeof(unsigned)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < chain; ++i) {
        cudaLaunchAttribute attr[1];
        const cudaLaunchConfig_t cfg = launch_config(dim3(grid), dim3(256), s, mode != kPlain, attr);
        CK(cudaLaunchKernelEx(&cfg, link, mode, i, work_ns, go, done, counters, grid));
    }
    CK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<double> hand;
    std::vector<unsigned long long> hgo(chain), hdone(chain);
    for (int r = 0; r < replays + 3; ++r) {
        CK(cudaMemsetAsync(go, 0xff, chain * sizeof(unsigned long long), s));
        CK(cudaMemsetAsync(done, 0, chain * sizeof(unsigned long long), s));
        CK(cudaMemsetAsync(counters, 0, chain * sizeof(unsigned), s));
        CK(cudaGraphLaunch(ge, s));
        CK(cudaStreamSynchronize(s));
        if (r < 3) continue;  // warm-up replays
        CK(cudaMemcpy(hgo.data(), go, chain * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hdone.data(), done, chain * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        for (int i = 0; i + 1 < chain; ++i) hand.push_back((double)(long long)(hgo[i + 1] - hdone[i]));
    }
    std::sort(hand.begin(), hand.end());
    Result res{hand[hand.size() / 2], hand[hand.size() / 10], hand[hand.size() * 9 / 10]};
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(s));
    CK(cudaFree(go));
    CK(cudaFree(done));
    CK(cudaFree(counters));
    return res;
}

int main(int argc, char** argv) {
    const int chain = 64, replays = 50;
    const unsigned long long work_ns = 5000;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int grids[] = {1, sms, 2 * sms};
    printf("{\"chain\": %d, \"replays\": %d, \"work_ns\": %llu, \"sms\": %d, \"handoff_ns\": [", chain, replays,
           work_ns, sms);
    bool first = true;
    for (int grid : grids) {
        for (int mode = 0; mode < 4; ++mode) {
            const Result r = run_mode(mode, grid, chain, work_ns, replays);
            printf("%s\n  {\"mode\": \"%s\", \"grid\": %d, \"median\": %.0f, \"p10\": %.0f, \"p90\": %.0f}",
                   first ? "" : ",", kModeNames[mode], grid, r.median_ns, r.p10_ns, r.p90_ns);
            first = false;
        }
    }
    printf("\n]}\n");
    return 0;
}
