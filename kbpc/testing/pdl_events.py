"""A CUDA-graph check of programmatic dependent launch across a cross-stream event wait (the case
`--pdl-across-events` marks): captured from two streams as the step program does,

    stream A: memset(buf, -1) -> record fork -> a_first ---------> wait(written) -> reader [PDL]
    stream B:                    wait(fork) -> slow_writer(buf) -> record written

where slow_writer spins `spin_ns` before writing buf[i] = value + i and reader calls
kbp::pdl_wait() before reading buf. The three kernels go through the product's launcher template
(templates/kernel_instance.cu.j2, via kbpc.testing.launchers.render_launcher), so the reader is
launched exactly as the step program launches a PDL kernel. After capture the harness reads the
reader's incoming edges (type and port: which of them capture made programmatic), instantiates
the graph and replays it `reps` times, counting the elements the reader saw wrong.

Built by tests/nvcc/test_pdl_events_build.py (no GPU) and run by tests/gpu/test_gpu_pdl_events.py."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from kbpc.codegen.records import KernelInstance
from kbpc.targets import get_target
from kbpc.testing.launchers import render_launcher
from kbpc.toolchain.nvcc import compile_cuda

HEADER_NAME = "kbp_pdl_events_test.cuh"

HEADER = r"""// kbp_pdl_events_test.cuh: the kernels of kbpc/testing/pdl_events.py (test only).
#pragma once
#include "kbp_common.cuh"

namespace kbp_test {

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Stream B: lets dependents launch at once, waits out spin_ns, then writes buf[i] = value + i; so
// a reader whose edge from here is programmatic may run beside it, and only its pdl_wait() (which
// waits for the whole grid to complete and its writes to be visible) keeps it from reading early.
template <int Tag>
__global__ void slow_writer(int* buf, int n, int value, unsigned long long spin_ns) {
    kbp::pdl_wait();
    kbp::pdl_launch_dependents();
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < spin_ns) {
    }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) buf[i] = value + i;
}

// Stream A before the event wait: a short kernel, so the reader has a kernel before it on its stream.
template <int Tag>
__global__ void a_first(int* flag, int value) {
    kbp::pdl_wait();
    kbp::pdl_launch_dependents();
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = value;
}

// Stream A after the event wait (launched with PDL): reads buf and the flag after pdl_wait(),
// copies buf to out and counts the elements that are not what the writer and a_first wrote.
// wait == 0 skips pdl_wait() (breaking the kernel contract on purpose) and the flag: a probe of
// whether the writer's edge lets the reader run early at all.
template <int Tag>
__global__ void reader(const int* buf, const int* flag, int n, int value, int wait, int* out, int* bad) {
    if (wait) kbp::pdl_wait();
    int wrong = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const int v = buf[i];
        out[i] = v;
        wrong += v != value + i;
    }
    if (wait && blockIdx.x == 0 && threadIdx.x == 0) wrong += *flag != value;   // a_first triggers early
    if (wrong) atomicAdd(bad, wrong);
}

}  // namespace kbp_test
"""

WRITER = KernelInstance("pdl_events_test", HEADER_NAME, "kbp_test::slow_writer<0>",
                        ("int*", "int", "int", "unsigned long long"))
FIRST = KernelInstance("pdl_events_test", HEADER_NAME, "kbp_test::a_first<0>", ("int*", "int"))
READER = KernelInstance("pdl_events_test", HEADER_NAME, "kbp_test::reader<0>",
                        ("const int*", "const int*", "int", "int", "int", "int*", "int*"))

# edges[]: for the reader's edge from a_first, then from slow_writer: type, from_port (-1: no edge).
HARNESS = r"""
#include <cstdio>
#include <cstring>

#define KBP_TRY(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    snprintf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_)); rc = (int)e_; goto done; } } while (0)

// The node just captured on `s` (its dependency set holds exactly that node after a launch).
static cudaError_t last_node(cudaStream_t s, cudaGraphNode_t* node) {
    cudaStreamCaptureStatus status;
    const cudaGraphNode_t* deps = nullptr;
    const cudaGraphEdgeData* data = nullptr;
    size_t n = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, &data, &n);
    if (e != cudaSuccess) return e;
    if (status != cudaStreamCaptureStatusActive || n != 1) return cudaErrorIllegalState;
    *node = deps[0];
    return cudaSuccess;
}

extern "C" int kbp_pdl_events_run(int reps, int n, unsigned long long spin_ns, int reader_pdl, int reader_waits, int* bad_out,
                                  int* out_host, int* edges, char* err, int errlen) {
    int rc = 0;
    const int value = 12345;
    int *buf = nullptr, *flag = nullptr, *out = nullptr, *bad = nullptr;
    cudaStream_t a = nullptr, b = nullptr;
    cudaEvent_t fork = nullptr, written = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t deps[8];
    cudaGraphEdgeData data[8];
    size_t ndeps = 8;
    cudaGraphNode_t writer_node = nullptr, first_node = nullptr, reader_node = nullptr;
    err[0] = 0;
    for (int i = 0; i < 4; ++i) edges[i] = -1;
    KBP_TRY(cudaMalloc(&buf, n * sizeof(int)));
    KBP_TRY(cudaMalloc(&flag, sizeof(int)));
    KBP_TRY(cudaMalloc(&out, n * sizeof(int)));
    KBP_TRY(cudaMalloc(&bad, sizeof(int)));
    KBP_TRY(cudaMemset(bad, 0, sizeof(int)));
    KBP_TRY(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    KBP_TRY(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    KBP_TRY(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    KBP_TRY(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
    KBP_TRY(cudaDeviceSynchronize());

    // Each launch's node is the capturing stream's whole dependency set right after it.
    KBP_TRY(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
    KBP_TRY(cudaMemsetAsync(buf, 0xff, n * sizeof(int), a));      // -1 everywhere: a too-early read sees it
    KBP_TRY(cudaMemsetAsync(flag, 0, sizeof(int), a));
    KBP_TRY(cudaEventRecord(fork, a));
    KBP_TRY(cudaStreamWaitEvent(b, fork, 0));
    KBP_TRY(kbp_launch_WRITER(dim3(8), dim3(128), 0, b, 0, buf, n, value, spin_ns));
    KBP_TRY(last_node(b, &writer_node));
    KBP_TRY(cudaEventRecord(written, b));
    KBP_TRY(kbp_launch_FIRST(dim3(1), dim3(32), 0, a, 0, flag, value));
    KBP_TRY(last_node(a, &first_node));
    KBP_TRY(cudaStreamWaitEvent(a, written, 0));
    KBP_TRY(kbp_launch_READER(dim3(4), dim3(128), 0, a, reader_pdl, buf, flag, n, value, reader_waits, out, bad));
    KBP_TRY(last_node(a, &reader_node));
    KBP_TRY(cudaStreamEndCapture(a, &graph));

    KBP_TRY(cudaGraphNodeGetDependencies(reader_node, deps, data, &ndeps));
    for (size_t i = 0; i < ndeps; ++i) {
        const int slot = deps[i] == first_node ? 0 : deps[i] == writer_node ? 2 : -1;
        if (slot >= 0) { edges[slot] = data[i].type; edges[slot + 1] = data[i].from_port; }
    }

    KBP_TRY(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < reps; ++r) KBP_TRY(cudaGraphLaunch(exec, a));
    KBP_TRY(cudaStreamSynchronize(a));
    KBP_TRY(cudaMemcpy(bad_out, bad, sizeof(int), cudaMemcpyDeviceToHost));
    KBP_TRY(cudaMemcpy(out_host, out, n * sizeof(int), cudaMemcpyDeviceToHost));
done:
    if (a) {   // a failure mid-capture leaves the stream capturing
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t partial = nullptr;
        if (cudaStreamIsCapturing(a, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone &&
            cudaStreamEndCapture(a, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (fork) cudaEventDestroy(fork);
    if (written) cudaEventDestroy(written);
    if (a) cudaStreamDestroy(a);
    if (b) cudaStreamDestroy(b);
    cudaFree(buf); cudaFree(flag); cudaFree(out); cudaFree(bad);
    return rc;
}
"""

VALUE = 12345          # what the writer adds to each index (HARNESS's `value`)
EDGE_PROGRAMMATIC = 1  # cudaGraphDependencyTypeProgrammatic


def program_source() -> str:
    """The three instance TUs as the product renders them, then the harness."""
    text = "".join(render_launcher(inst) for inst in (WRITER, FIRST, READER))
    harness = HARNESS
    for tag, inst in (("WRITER", WRITER), ("FIRST", FIRST), ("READER", READER)):
        harness = harness.replace(f"kbp_launch_{tag}(", f"kbp_launch_{inst.name}(")
        harness = harness.replace(f"{tag}_FN", inst.kernel)
    return text + harness


def build(folder: Path, target: str = "sm_90") -> Path:
    """Write the header and program into `folder` and build the shared library there."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HEADER_NAME).write_text(HEADER)
    src = folder / "pdl_events.cu"
    src.write_text(program_source())
    lib = folder / "pdl_events.so"
    compile_cuda(src, lib, get_target(target), kind="shared", include_dirs=(folder,))
    return lib


@dataclass(frozen=True)
class PdlEventsResult:
    bad: int                          # elements the reader saw wrong, summed over the replays
    out: tuple[int, ...]              # what the last replay's reader read
    first_edge: tuple[int, int]       # the reader's edge from a_first: (type, from_port); -1: none
    writer_edge: tuple[int, int]      # the reader's edge from slow_writer (across the event wait)


def run(library: Path, reps: int = 20, n: int = 4096, spin_ns: int = 200_000, reader_pdl: bool = True,
        reader_waits: bool = True) -> PdlEventsResult:
    lib = ctypes.CDLL(str(library))
    fn = lib.kbp_pdl_events_run
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                   ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int]
    bad, out, edges = ctypes.c_int(-1), (ctypes.c_int * n)(), (ctypes.c_int * 4)()
    err = ctypes.create_string_buffer(512)
    rc = fn(reps, n, spin_ns, int(reader_pdl), int(reader_waits), ctypes.byref(bad), out, edges, err, len(err))
    if rc != 0:
        raise RuntimeError(f"PDL-across-events graph failed (rc {rc}): {err.value.decode()}")
    return PdlEventsResult(bad.value, tuple(out), (edges[0], edges[1]), (edges[2], edges[3]))
