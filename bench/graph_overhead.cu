// graph_overhead.cu: what a replayed CUDA graph costs beyond its kernels' span, as a function of its
// node count and of side-stream branches. Standalone (no kbpc import):
//   nvcc -O3 -std=c++17 -arch=sm_90 -o graph_overhead bench/graph_overhead.cu && ./graph_overhead
// prints one JSON object. Why: `kbpc bench` times a step on the host (graph launch to synchronize),
// the replay timeline from the first kernel's start to the last one's end; on an H200 the 650-launch
// seed step's host time was ~0.43 ms above its span, and 90 more one-warp launches on a side stream
// (each joined back by an event) made the span 93 us shorter but the host time 35-90 us longer.
//
// A graph holds N launches of one kernel on stream 0, each one CTA of 32 threads that busy-waits
// WORK_NS (every launch after the first with the PDL attribute, griddepcontrol.launch_dependents
// then griddepcontrol.wait, as every kbpc kernel). With SIDE > 0, after every SIDE-th launch a
// second kernel runs on stream 1 (event recorded on stream 0, waited on stream 1), and the launch
// SIDE places later on stream 0 waits for an event recorded after it: the pattern of a kernel
// issued aside whose reader comes later. Per configuration (median over REPLAYS replays):
//   host_us   cudaGraphLaunch + cudaStreamSynchronize on the host
//   span_us   the first kernel's start to the last kernel's end (%globaltimer, written by them)
//   event_us  cudaEventElapsedTime of events recorded on stream 0 around the launch
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "bench_cuda.cuh"

// stamps[0]: the first launch's start; stamps[1]: the last launch's end.
__global__ void __launch_bounds__(32) node(int first, int last, unsigned long long work_ns,
                                          unsigned long long* stamps) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const unsigned long long t0 = gtime();
    if (first && threadIdx.x == 0) stamps[0] = t0;
    while (gtime() - t0 < work_ns) {
    }
    if (last && threadIdx.x == 0) stamps[1] = gtime();
}

static void launch(cudaStream_t s, bool pdl, int first, int last, unsigned long long work_ns,
                   unsigned long long* stamps) {
    cudaLaunchAttribute attr[1];
    const cudaLaunchConfig_t cfg = launch_config(dim3(1), dim3(32), s, pdl, attr);
    CK(cudaLaunchKernelEx(&cfg, node, first, last, work_ns, stamps));
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char** argv) {
    const unsigned long long work_ns = argc > 1 ? strtoull(argv[1], nullptr, 10) : 5000;
    const int replays = argc > 2 ? atoi(argv[2]) : 50;
    cudaStream_t s0, s1;
    CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    unsigned long long* stamps;
    CK(cudaMalloc(&stamps, 2 * sizeof(unsigned long long)));
    cudaEvent_t ta, tb;
    CK(cudaEventCreate(&ta));
    CK(cudaEventCreate(&tb));
    printf("{\"work_ns\": %llu, \"replays\": %d, \"configs\": [", work_ns, replays);
    const int counts[] = {64, 256, 650, 1024};
    const int sides[] = {0, 7};
    bool first_row = true;
    for (int n : counts) {
        for (int side : sides) {
            std::vector<cudaEvent_t> evs;
            CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeThreadLocal));
            int side_nodes = 0;
            std::vector<std::pair<int, cudaEvent_t>> joins;   // (launch index that waits, event)
            for (int i = 0; i < n; ++i) {
                for (auto& j : joins)
                    if (j.first == i) CK(cudaStreamWaitEvent(s0, j.second, 0));
                launch(s0, i > 0, i == 0, i == n - 1, work_ns, stamps);
                if (side > 0 && i % side == 0 && i + side < n) {
                    cudaEvent_t fork, join;
                    CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
                    CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
                    evs.push_back(fork);
                    evs.push_back(join);
                    CK(cudaEventRecord(fork, s0));
                    CK(cudaStreamWaitEvent(s1, fork, 0));
                    launch(s1, side_nodes > 0, 0, 0, 1000, stamps);
                    CK(cudaEventRecord(join, s1));
                    joins.push_back({i + side, join});
                    ++side_nodes;
                }
            }
            cudaGraph_t graph;
            CK(cudaStreamEndCapture(s0, &graph));
            cudaGraphExec_t exec;
            CK(cudaGraphInstantiate(&exec, graph, 0));
            size_t nodes = 0, edges = 0;
            CK(cudaGraphGetNodes(graph, nullptr, &nodes));
            CK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
            for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(exec, s0));
            CK(cudaStreamSynchronize(s0));
            std::vector<double> host, span, ev;
            for (int r = 0; r < replays; ++r) {
                CK(cudaEventRecord(ta, s0));
                const auto h0 = std::chrono::steady_clock::now();
                CK(cudaGraphLaunch(exec, s0));
                CK(cudaEventRecord(tb, s0));
                CK(cudaStreamSynchronize(s0));
                const auto h1 = std::chrono::steady_clock::now();
                unsigned long long st[2];
                CK(cudaMemcpy(st, stamps, sizeof(st), cudaMemcpyDeviceToHost));
                float ms = 0.0f;
                CK(cudaEventElapsedTime(&ms, ta, tb));
                host.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count());
                span.push_back((st[1] - st[0]) * 1e-3);
                ev.push_back(ms * 1e3);
            }
            const double mh = median(host), ms = median(span), me = median(ev);
            printf("%s\n  {\"launches\": %d, \"side_launches\": %d, \"graph_nodes\": %zu, \"graph_edges\": %zu, "
                   "\"host_us\": %.1f, \"span_us\": %.1f, \"event_us\": %.1f, \"host_minus_span_us\": %.1f}",
                   first_row ? "" : ",", n, side_nodes, nodes, edges, mh, ms, me, mh - ms);
            first_row = false;
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            for (auto e : evs) CK(cudaEventDestroy(e));
        }
    }
    printf("\n]}\n");
    return 0;
}
