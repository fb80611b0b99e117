"""In-graph timing and the streaming-read yardstick for bench/kernels.py.

- `stream_read_case(nbytes)`: a pure streaming read of `nbytes` (16-byte loads over every SM,
  rotating buffers larger than L2): the ceiling a kernel reading those bytes can reach in the same
  setting. It writes one word only if the data holds an impossible pattern, so it moves no bytes but
  the reads.
- `time_in_graph(case, reps)`: the case's kernel captured into one CUDA graph, each launch after a
  dependent tiny kernel (a one-thread write the next launch is ordered after), max(ITERS, rotations)
  launches per graph over the rotating input sets; the per-launch time is (graph - graph of the tiny kernels
  alone) / launches, so it includes the dependency's drain and refill, as inside a decode step.

Capture goes through the CUDA driver API (ctypes on libcuda, in the context PyCUDA retained); the
kernels are PyCUDA launches on a PyCUDA stream, so a case's launch(i, stream) must take a stream.
"""
from __future__ import annotations

import ctypes
import inspect
import statistics

from kernels import Case, rotations

ITERS = 20
_SRC = r"""
extern "C" __global__ void __launch_bounds__(256) stream_read(const uint4* __restrict__ p, unsigned long long n16,
                                                              unsigned* __restrict__ sink) {
    unsigned acc = 0;
    unsigned long long i = blockIdx.x * 256ull + threadIdx.x, step = gridDim.x * 256ull;
    for (; i + 3 * step < n16; i += 4 * step) {  // four 16-byte loads in flight per thread
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + step), c = __ldcs(p + i + 2 * step), d = __ldcs(p + i + 3 * step);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += step) { uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9e3779b9u) *sink = acc;
}
extern "C" __global__ void touch(unsigned* flag) { *flag += 1u; }
"""


def _mod():
    from kbpc.testing.gpu import load_module  # noqa: PLC0415
    return load_module(_SRC, "bench_stream_read")


def stream_read_case(nbytes: int) -> Case:
    def setup():
        import numpy as np  # noqa: PLC0415
        import pycuda.driver as cuda  # noqa: PLC0415
        from pycuda import gpuarray  # noqa: PLC0415
        f = _mod().get_function("stream_read")
        n16 = max(1, nbytes // 16)
        bufs = [gpuarray.empty((16 * n16,), np.uint8) for _ in range(rotations(16 * n16))]
        for b in bufs:
            cuda.memset_d8(b.gpudata, 0x3C, b.nbytes)
        sink = gpuarray.zeros((1,), np.uint32)
        sms = cuda.Context.get_device().get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
        grid = (min(8 * sms, max(1, -(-n16 // 1024))), 1)

        def launch(i, stream=None):
            f(bufs[i % len(bufs)].gpudata, np.uint64(n16), sink.gpudata, block=(256, 1, 1), grid=grid, stream=stream)
        return launch
    return Case(f"stream_read {nbytes}", f"{nbytes} B", nbytes, setup)


class _Driver:
    """The few driver calls graph capture needs (CUresult 0 = success)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def call(self, names: tuple[str, ...], *args) -> None:
        for name in names:
            fn = getattr(self.lib, name, None)
            if fn is not None:
                rc = fn(*args)
                if rc != 0:
                    raise RuntimeError(f"{name} failed: CUresult {rc}")
                return
        raise RuntimeError(f"libcuda has none of {names}")

    def capture(self, stream, body) -> ctypes.c_void_p:
        h = ctypes.c_void_p(stream.handle)
        self.call(("cuStreamBeginCapture_v2", "cuStreamBeginCapture"), h, ctypes.c_int(2))  # relaxed mode
        graph = ctypes.c_void_p()
        try:
            body()
        finally:
            self.call(("cuStreamEndCapture",), h, ctypes.byref(graph))
        exe = ctypes.c_void_p()
        self.call(("cuGraphInstantiateWithFlags",), ctypes.byref(exe), graph, ctypes.c_ulonglong(0))
        self.call(("cuGraphDestroy",), graph)
        return exe

    def launch(self, exe, stream) -> None:
        self.call(("cuGraphLaunch",), exe, ctypes.c_void_p(stream.handle))

    def destroy(self, exe) -> None:
        self.call(("cuGraphExecDestroy",), exe)


def takes_stream(launch) -> bool:
    return "stream" in inspect.signature(launch).parameters


def time_in_graph(case: Case, reps: int) -> float | None:
    """Median microseconds per launch of `case` inside a graph, after a dependent tiny kernel (None
    for a case whose launch takes no stream)."""
    import numpy as np  # noqa: PLC0415
    import pycuda.driver as cuda  # noqa: PLC0415
    from pycuda import gpuarray  # noqa: PLC0415

    drv, stream = _Driver(), cuda.Stream()
    touch = _mod().get_function("touch")
    flag = gpuarray.zeros((1,), np.uint32)
    launch = case.setup()
    if not takes_stream(launch):
        return None

    iters = max(ITERS, rotations(case.bytes_moved))  # the graph's launches touch > 4x L2

    def body(with_kernel: bool):
        def run():
            for i in range(iters):
                touch(flag.gpudata, block=(1, 1, 1), grid=(1, 1), stream=stream)
                if with_kernel:
                    launch(i, stream=stream)
        return run

    graphs = [drv.capture(stream, body(k)) for k in (True, False)]
    start, end = cuda.Event(), cuda.Event()
    per = []
    try:
        for exe in graphs:
            drv.launch(exe, stream)  # warm-up
            stream.synchronize()
            t = []
            for _ in range(reps):
                start.record(stream)
                drv.launch(exe, stream)
                end.record(stream)
                end.synchronize()
                t.append(start.time_till(end) * 1e3)
            per.append(statistics.median(t))
    finally:
        for exe in graphs:
            drv.destroy(exe)
    return (per[0] - per[1]) / iters
