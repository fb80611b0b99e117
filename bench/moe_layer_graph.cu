// In-graph benchmark harness of a MoE layer (bench/moe_layer_bench.py builds it per shape with
// -DMOE_H=... etc., loads it with ctypes, and passes PyCUDA device pointers).
//
// A graph holds `n` layers, each: a dependent kernel (dep_write: writes the layer's input row, the
// role of the hyper-connection pre-mix + norm before a MoE layer), then one of
//   mode 0  the fused layer: kbp::moe_layer phase 0, phase 1
//   mode 1  the streaming ceiling: a pure read of the bytes phase 0 must read, then of phase 1's
//   mode 2  the unfused chain kbpc lowered before fusion: router GEMV, top-k, gate_up slots (static
//           quantization inside), SwiGLU, down slots, the shared expert pair, combine
// every launch with programmatic dependent launch when pdl != 0 (all these kernels wait in
// kbp::pdl_wait before their first dependent access). The graph is replayed on the legacy default
// stream, so events recorded there (PyCUDA's) bracket it.
#include <cuda_runtime.h>

#include "glm_moe_combine.cuh"
#include "glm_moe_layer.cuh"
#include "glm_swiglu_clamp.cuh"
#include "w4a4_mx_static.cuh"

constexpr int H = MOE_H, I = MOE_I, ISH = MOE_ISH, E = MOE_E, TOPK = MOE_TOPK;
constexpr int PG = MOE_PG, SG = MOE_SG, PD = MOE_PD, SD = MOE_SD;
constexpr int MAX_RANGES = 24;

// One layer's device pointers and scalars (bench/moe_layer_bench.py packs the same layout).
struct MoeBenchLayer {
    const __nv_bfloat16 *xsrc, *w_router;
    __nv_bfloat16* xn;
    const float* bias;
    const uint8_t *gu_codes, *gu_scales;
    const float* gu_sg;
    const uint8_t *dn_codes_w, *dn_scales_w;
    const float* dn_sg;
    const uint8_t *sh_codes, *sh_scales, *shd_codes, *shd_scales;
    __nv_bfloat16* y;
    float routed_scale, gamma_gu, gamma_dn, limit, sh_sg, shd_sg;
    int ids[32];  // the experts the bias selects (for the streaming read of the same bytes)
};

struct Ranges {
    const uint4* p[MAX_RANGES];
    unsigned long long n16[MAX_RANGES];
    int count;
};

__global__ void dep_write(const uint4* __restrict__ src, uint4* __restrict__ dst, int n16) {
    kbp::pdl_wait();
    for (int i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = src[i];
    kbp::pdl_launch_dependents();
}

__global__ void stream_read(const __grid_constant__ Ranges r, int* sink) {
    kbp::pdl_wait();
    kbp::pdl_launch_dependents();
    uint32_t acc = 0;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (int k = 0; k < r.count; ++k)
        for (size_t i = tid; i < r.n16[k]; i += stride) {
            const uint4 v = __ldcs(r.p[k] + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    if (acc == 0x9e3779b9u) *sink = 1;  // keeps the loads
}

namespace {
cudaStream_t g_stream;
bool g_pdl;
cudaError_t g_err = cudaSuccess;

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = g_stream;
    c.attrs = attr;
    c.numAttrs = g_pdl ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&c, kernel, static_cast<P>(args)...);
    if (g_err == cudaSuccess) g_err = e;
}

struct Scratch {  // the unfused chain's intermediates and the stream reader's sink
    float *logits, *topk_w;
    int *topk_id, *sink;
    __nv_bfloat16 *egu, *eact, *edown, *sdown;
};

void add(Ranges& r, const void* p, size_t bytes) {
    r.p[r.count] = static_cast<const uint4*>(p);
    r.n16[r.count++] = bytes / 16;
}

void fused(const MoeBenchLayer& L, int grid_gu, int grid_dn, size_t smem_gu, size_t smem_dn) {
    auto kernel = kbp::moe_layer<H, I, ISH, E, TOPK, 1, PG, SG, PD, SD>;
    for (int phase = 0; phase < 2; ++phase)
        launch(kernel, dim3(phase ? grid_dn : grid_gu), dim3(256), phase ? smem_dn : smem_gu, phase, L.xn,
               L.w_router, L.bias, L.routed_scale, L.gamma_gu, L.gu_codes, L.gu_scales, L.gu_sg, L.gamma_dn, L.limit,
               L.dn_codes_w, L.dn_scales_w, L.dn_sg, L.sh_codes, L.sh_scales, L.sh_sg, L.shd_codes, L.shd_scales,
               L.shd_sg, L.y, H / 4, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
               nullptr);
}

void streaming(const MoeBenchLayer& L, int grid, const Scratch& s) {
    Ranges gu = {}, dn = {};
    add(gu, L.w_router, (size_t)E * H * 2);
    for (int k = 0; k < TOPK; ++k) {
        const size_t e = L.ids[k];
        add(gu, L.gu_codes + e * 2 * I * (H / 2), (size_t)2 * I * (H / 2));
        add(gu, L.gu_scales + e * 2 * I * (H / 16), (size_t)2 * I * (H / 16));
        add(dn, L.dn_codes_w + e * H * (I / 2), (size_t)H * (I / 2));
        add(dn, L.dn_scales_w + e * H * (I / 16), (size_t)H * (I / 16));
    }
    if (ISH > 0) {
        add(gu, L.sh_codes, (size_t)2 * ISH * (H / 2));
        add(gu, L.sh_scales, (size_t)2 * ISH * (H / 16));
        add(dn, L.shd_codes, (size_t)H * (ISH / 2));
        add(dn, L.shd_scales, (size_t)H * (ISH / 16));
    }
    launch(stream_read, dim3(grid), dim3(256), 0, gu, s.sink);
    launch(stream_read, dim3(grid), dim3(256), 0, dn, s.sink);
}

void unfused(const MoeBenchLayer& L, const Scratch& s) {
    constexpr int S = TOPK;
    launch(kbp::dense_gemv_bf16<H, float>, dim3((E + 3) / 4), dim3(256), 0, L.w_router, L.xn, s.logits, E);
    launch(kbp::router_topk<E, TOPK>, dim3(1), dim3(kbp::router_threads(E)), 0, s.logits, L.bias, L.routed_scale,
           s.topk_w, s.topk_id);
    launch(kbp::w4a4_gemv_moe_slots_bf16<H>, dim3(2 * I / 16, S), dim3(256), 0, s.topk_id, TOPK, L.xn, L.gamma_gu,
           L.gu_codes, L.gu_scales, L.gu_sg, s.egu, 2 * I);
    launch(kbp::swiglu_clamp<I, 8, kbp::SwiGluOut::kBF16, false>, dim3((I + 1023) / 1024, S), dim3(128), 0, s.egu,
           s.egu + I, (long)(2 * I), (void*)s.eact, (long)I, L.limit, (float*)nullptr, (size_t)0);
    launch(kbp::w4a4_gemv_moe_slots_bf16<I>, dim3(H / 16, S), dim3(256), 0, s.topk_id, 1, s.eact, L.gamma_dn,
           L.dn_codes_w, L.dn_scales_w, L.dn_sg, s.edown, H);
    if (ISH > 0) {
        for (int phase = 0; phase < 2; ++phase)
            launch(kbp::w4a16_shared_pair<H, ISH>, dim3(phase ? (H + 15) / 16 : (2 * ISH + 15) / 16), dim3(256), 0,
                   phase, L.sh_codes, L.sh_scales, L.sh_sg, L.xn, L.shd_codes, L.shd_scales, L.shd_sg, L.limit,
                   s.sdown, H);
    }
    launch(kbp::moe_combine<H, TOPK, 8>, dim3((H + 511) / 512), dim3(64), 0, s.topk_w, (const int*)nullptr,
           (const int*)nullptr, s.edown, s.sdown, L.y);
}
}  // namespace

struct MoeBenchGraph {
    cudaGraphExec_t exec;
    Scratch scratch;
};

extern "C" int moe_bench_layer_bytes() { return (int)sizeof(MoeBenchLayer); }

// Build the graph of `n` layers in `mode` (see the file header); *out receives a handle.
extern "C" int moe_bench_build(const MoeBenchLayer* layers, int n, int mode, int pdl, int grid_gu, int grid_dn,
                               unsigned long long smem_gu, unsigned long long smem_dn, void** out) {
    auto* g = new MoeBenchGraph();
    Scratch& s = g->scratch;
    cudaMalloc(&s.logits, E * 4);
    cudaMalloc(&s.topk_w, TOPK * 4);
    cudaMalloc(&s.topk_id, TOPK * 4);
    cudaMalloc(&s.sink, 4);
    cudaMalloc(&s.egu, (size_t)TOPK * 2 * I * 2);
    cudaMalloc(&s.eact, (size_t)TOPK * I * 2);
    cudaMalloc(&s.edown, (size_t)TOPK * H * 2);
    cudaMalloc(&s.sdown, (size_t)H * 2 + 16);
    auto kernel = kbp::moe_layer<H, I, ISH, E, TOPK, 1, PG, SG, PD, SD>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem_gu > smem_dn ? smem_gu : smem_dn));
    cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
    g_pdl = pdl != 0;
    g_err = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
    for (int l = 0; l < n; ++l) {
        const MoeBenchLayer& L = layers[l];
        launch(dep_write, dim3(1), dim3(256), 0, reinterpret_cast<const uint4*>(L.xsrc), reinterpret_cast<uint4*>(L.xn),
               H / 8);
        if (mode == 0) fused(L, grid_gu, grid_dn, smem_gu, smem_dn);
        else if (mode == 1) streaming(L, grid_gu, s);
        else unfused(L, s);
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
    if (g_err == cudaSuccess) g_err = end;
    if (g_err == cudaSuccess) g_err = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    *out = g;
    return (int)g_err;
}

extern "C" int moe_bench_launch(void* handle) {
    return (int)cudaGraphLaunch(static_cast<MoeBenchGraph*>(handle)->exec, 0);
}

extern "C" int moe_bench_free(void* handle) {
    auto* g = static_cast<MoeBenchGraph*>(handle);
    cudaDeviceSynchronize();
    cudaGraphExecDestroy(g->exec);
    const Scratch& s = g->scratch;
    for (void* p : {(void*)s.logits, (void*)s.topk_w, (void*)s.topk_id, (void*)s.sink, (void*)s.egu, (void*)s.eact,
                    (void*)s.edown, (void*)s.sdown})
        cudaFree(p);
    delete g;
    return (int)cudaGetLastError();
}
