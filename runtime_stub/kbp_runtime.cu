// kbp_runtime.cu: the hand-written runtime of every kbpc artifact: streams, events, CUDA-graph
// capture of the generated step, and the C ABI declared in kbp_runtime.h.
#include "kbp_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

namespace {

thread_local char g_error[512] = "";

int fail(const char* what, cudaError_t e) {
    snprintf(g_error, sizeof g_error, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return (int)e;
}

}  // namespace

// Defined by kbp_tp.cu in tensor-parallel libraries only; null (weak) in a tp = 1 library.
extern "C" void* kbp_tp_comm_buffer(void) __attribute__((weak));

struct KbpHandle {
    KbpBindings bindings{};
    std::vector<cudaStream_t> streams;
    std::vector<cudaEvent_t> events;   // the plan's events, then fork, then one join per stream
    std::vector<float> scalars;
    int* io = nullptr;                 // device: token, position, seq_len
    int* io_host = nullptr;            // pinned: token, position, seq_len uploaded; [4..5] greedy read-back
    void* greedy = nullptr;            // device: kbp_greedy.cu's scratch
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    int use_graph = 1;
    int programmatic_edges = 0;        // of the captured graph (count_edges)
    int total_edges = 0;
};

extern "C" {

const KbpStepInfo* kbp_info(void) { return &kbp_step_info; }
const unsigned long long* kbp_weight_sizes(void) { return kbp_weight_bytes; }
const unsigned long long* kbp_state_sizes(void) { return kbp_state_bytes; }
const char* kbp_last_error(void) { return g_error; }

// The captured graph's edges, and how many capture made programmatic. (Measured with CUDA 13.0 on
// an H200: a launch issued with the PDL attribute after a cross-stream event wait gets programmatic
// edges from both its stream's kernel and the event's, not only the first.)
static cudaError_t count_edges(cudaGraph_t graph, int* programmatic, int* total) {
    size_t n = 0;
    cudaError_t e = cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n);
    if (e != cudaSuccess || n == 0) return e;
    std::vector<cudaGraphNode_t> from(n), to(n);
    std::vector<cudaGraphEdgeData> data(n);
    e = cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n);
    if (e != cudaSuccess) return e;
    *total = (int)n;
    *programmatic = 0;
    for (size_t i = 0; i < n; ++i) *programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
    return cudaSuccess;
}

static cudaError_t enqueue(KbpHandle* h) {
    const KbpStepInfo& info = kbp_step_info;
    cudaStream_t origin = h->streams[0];
    cudaEvent_t fork = h->events[info.events];
    cudaError_t e = cudaEventRecord(fork, origin);
    for (int s = 1; s < info.streams && e == cudaSuccess; ++s) e = cudaStreamWaitEvent(h->streams[s], fork, 0);
    if (e == cudaSuccess) e = kbp_enqueue_step(&h->bindings, h->streams.data(), h->events.data(), nullptr);
    for (int s = 1; s < info.streams && e == cudaSuccess; ++s) {
        cudaEvent_t join = h->events[info.events + s];
        e = cudaEventRecord(join, h->streams[s]);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(origin, join, 0);
    }
    return e;
}

KbpHandle* kbp_create(void* arena, const void* const* weights, void* const* state, int use_graph) {
    const KbpStepInfo& info = kbp_step_info;
    KbpHandle* h = new KbpHandle();
    h->use_graph = use_graph;
    cudaError_t e = cudaSuccess;
    h->scalars.assign(info.weights > 0 ? info.weights : 1, 0.0f);
    for (int i = 0; i < info.weights && e == cudaSuccess; ++i)   // static scales, read once
        if (kbp_weight_bytes[i] == sizeof(float)) e = cudaMemcpy(&h->scalars[i], weights[i], sizeof(float), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) { fail("reading static scales", e); delete h; return nullptr; }
    h->streams.resize(info.streams);
    for (auto& s : h->streams)
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    h->events.resize(info.events + info.streams);
    for (auto& ev : h->events)
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&h->io, 3 * sizeof(int));
    if (e == cudaSuccess) e = cudaMallocHost(&h->io_host, 8 * sizeof(int));
    if (e == cudaSuccess) e = cudaMalloc(&h->greedy, KBP_GREEDY_SCRATCH_BYTES);
    if (e == cudaSuccess) e = cudaMemsetAsync(h->greedy, 0, KBP_GREEDY_SCRATCH_BYTES, h->streams[0]);
    if (e != cudaSuccess) { fail("creating streams and buffers", e); kbp_destroy(h); return nullptr; }
    void* comm = kbp_tp_comm_buffer ? kbp_tp_comm_buffer() : nullptr;
    if (info.tp_ranks > 1 && comm == nullptr) {
        fail("a tensor-parallel step needs kbp_tp_init first", cudaErrorNotReady);
        kbp_destroy(h);
        return nullptr;
    }
    h->bindings = KbpBindings{arena, weights, state, h->scalars.data(), h->io, h->io + 1, h->io + 2, comm};
    if (use_graph) {
        e = cudaStreamBeginCapture(h->streams[0], cudaStreamCaptureModeThreadLocal);
        cudaError_t enq = e == cudaSuccess ? enqueue(h) : e;
        e = cudaStreamEndCapture(h->streams[0], &h->graph);
        if (enq != cudaSuccess) e = enq;
        if (e == cudaSuccess) e = count_edges(h->graph, &h->programmatic_edges, &h->total_edges);
        // Node priorities: the launches on the modelled critical path carry the highest priority
        // (the launch pass mark_priority); without the flag a graph ignores them.
        if (e == cudaSuccess) e = cudaGraphInstantiate(&h->exec, h->graph, cudaGraphInstantiateFlagUseNodePriority);
        if (e != cudaSuccess) { fail("capturing the step into a CUDA graph", e); kbp_destroy(h); return nullptr; }
    }
    return h;
}

int kbp_step(KbpHandle* h, int token, int position) {
    h->io_host[0] = token;
    h->io_host[1] = position;
    h->io_host[2] = position + 1;
    cudaError_t e = cudaMemcpyAsync(h->io, h->io_host, 3 * sizeof(int), cudaMemcpyHostToDevice, h->streams[0]);
    if (e != cudaSuccess) return fail("uploading token and position", e);
    e = h->use_graph ? cudaGraphLaunch(h->exec, h->streams[0]) : enqueue(h);
    if (e != cudaSuccess) return fail(h->use_graph ? "replaying the step graph" : "launching the step", e);
    return 0;
}

int kbp_profile_step(KbpHandle* h, int token, int position, float* mark_ms) {
    const KbpStepInfo& info = kbp_step_info;
    std::vector<cudaStream_t> one(info.streams, h->streams[0]);   // serialize: one stream
    std::vector<cudaEvent_t> marks(info.marks + 1, nullptr);
    cudaError_t e = cudaSuccess;
    for (auto& m : marks)
        if (e == cudaSuccess) e = cudaEventCreate(&m);
    h->io_host[0] = token;
    h->io_host[1] = position;
    h->io_host[2] = position + 1;
    if (e == cudaSuccess) e = cudaMemcpyAsync(h->io, h->io_host, 3 * sizeof(int), cudaMemcpyHostToDevice, h->streams[0]);
    if (e == cudaSuccess) e = cudaEventRecord(marks[0], h->streams[0]);
    if (e == cudaSuccess) e = kbp_enqueue_step(&h->bindings, one.data(), h->events.data(), marks.data() + 1);
    if (e == cudaSuccess) e = cudaStreamSynchronize(h->streams[0]);
    for (int i = 0; i < info.marks && e == cudaSuccess; ++i) e = cudaEventElapsedTime(&mark_ms[i], marks[i], marks[i + 1]);
    for (auto m : marks) if (m) cudaEventDestroy(m);
    return e == cudaSuccess ? 0 : fail("profiling the step", e);
}

int kbp_sync(KbpHandle* h) {
    cudaError_t e = cudaStreamSynchronize(h->streams[0]);
    return e == cudaSuccess ? 0 : fail("running the step", e);
}

void* kbp_stream(KbpHandle* h) { return (void*)h->streams[0]; }

int kbp_graph_edges(KbpHandle* h, int* programmatic, int* total) {
    if (!h->graph) return -1;
    *programmatic = h->programmatic_edges;
    *total = h->total_edges;
    return 0;
}

void* kbp_logits(KbpHandle* h) { return kbp_logits_ptr((uint8_t*)h->bindings.arena); }

int kbp_greedy(KbpHandle* h, int* token, int* nonfinite) {
    const KbpStepInfo& info = kbp_step_info;
    if (info.logits_bytes != 2ull * (unsigned long long)info.vocab)
        return fail("the greedy token: the step's logits are not one BF16 row", cudaErrorNotSupported);
    cudaStream_t s = h->streams[0];
    cudaError_t e = kbp_greedy_enqueue(kbp_logits(h), info.vocab, h->greedy, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(h->io_host + 4, (uint8_t*)h->greedy + kbp_greedy_result_offset(), 2 * sizeof(int),
                            cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return fail("the greedy token", e);
    *token = h->io_host[4];
    *nonfinite = h->io_host[5];
    return 0;
}

int kbp_destroy(KbpHandle* h) {
    if (!h) return 0;
    if (h->exec) cudaGraphExecDestroy(h->exec);
    if (h->graph) cudaGraphDestroy(h->graph);
    for (auto ev : h->events) if (ev) cudaEventDestroy(ev);
    for (auto s : h->streams) if (s) cudaStreamDestroy(s);
    if (h->io) cudaFree(h->io);
    if (h->io_host) cudaFreeHost(h->io_host);
    if (h->greedy) cudaFree(h->greedy);
    delete h;
    return 0;
}

}  // extern "C"
