"""Benchmark cases of the fused MoE layer (kernels/glm_moe_layer.cuh), for bench/kernels_projections.py.

Isolated (the runner's mode: back-to-back launches between events): both phases, phase 0 alone
(router + top-k + shared and routed gate_up), phase 1 alone (routed and shared down + combine),
launched through the product's launcher, rotating over LAYERS layer-sized input sets.

In-graph (bench/moe_layer_graph.cu, built here as a shared library): one CUDA graph of LAYERS
layers, each a dependent kernel writing the layer's input, then the fused layer (two launches);
the same graph with a pure streaming read of the very bytes each phase must read (the ceiling);
and the unfused chain of the blueprint's groups (router, top-k, gate_up slots, SwiGLU, down slots,
shared pair, combine), all launched with PDL. One runner launch replays the whole graph, so the
reported time covers LAYERS layers and bytes_moved counts them all.

Layer l routes to experts TOPK*l .. TOPK*l + TOPK-1: buffers are filled with a byte pattern
(0x3C), so every router logit is equal and the correction bias (1 on those experts) decides.
Every layer has its own router, shared expert and input; the expert stacks hold LAYERS*TOPK
experts (the seed: ~1 GB), so a graph replay reads well over twice the 50 MB L2."""
from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import numpy as np

from kernels import Case
from kbpc.codegen.families.glm_moe_layer import MoeLayerShape, plan_moe_layer

LAYERS = 8
BENCH_DIR = Path(__file__).resolve().parent
F32 = np.float32


def _nvfp4(n, k):
    return n * k // 2 + n * k // 16


def phase_bytes(s: MoeLayerShape) -> tuple[int, int]:
    """DRAM bytes a layer's phase 0 and phase 1 must move: every weight byte they read once, the
    input and the output."""
    h, i, ish, k = s.hidden, s.inter, s.shared_inter, s.top_k
    gate_up = 2 * s.experts * h + k * _nvfp4(2 * i, h) + _nvfp4(2 * ish, h) + 2 * h
    down = k * _nvfp4(h, i) + _nvfp4(h, ish) + 2 * h
    return gate_up, down


class Layers:
    """LAYERS layers' device buffers (byte-pattern filled) for one shape."""

    def __init__(self, s: MoeLayerShape):
        import pycuda.driver as cuda  # noqa: PLC0415
        from pycuda import gpuarray  # noqa: PLC0415
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415

        def dev(nbytes):
            a = gpuarray.empty((max(16, nbytes),), np.uint8)
            cuda.memset_d8(a.gpudata, 0x3C, a.nbytes)
            return a

        h, i, ish, e, k = s.hidden, s.inter, s.shared_inter, s.experts, s.top_k
        if LAYERS * k > e:
            raise ValueError(f"{LAYERS} layers x top {k} need {LAYERS * k} distinct experts, have {e}")
        ne = LAYERS * k
        self.shape = s
        self.gu = (dev(ne * 2 * i * h // 2), dev(ne * 2 * i * h // 16), to_gpu(np.full(ne, 1 / 64, F32)))
        self.dn = (dev(ne * h * i // 2), dev(ne * h * i // 16), to_gpu(np.full(ne, 1 / 64, F32)))
        self.layers = []
        for layer in range(LAYERS):
            bias = np.zeros(e, F32)
            ids = np.arange(layer * k, (layer + 1) * k, dtype=np.int32)
            bias[ids] = 1.0
            self.layers.append(dict(
                xsrc=dev(2 * h), xn=dev(2 * h), w_router=dev(2 * e * h), bias=to_gpu(bias), y=dev(2 * h),
                sh=(dev(2 * ish * h // 2), dev(2 * ish * h // 16)) if ish else (None, None),
                shd=(dev(h * ish // 2), dev(h * ish // 16)) if ish else (None, None), ids=ids,
                taps=dict(topk_w=dev(4 * k), topk_id=dev(4 * k), dn_codes=dev(k * i // 2), dn_scales=dev(k * i // 16),
                          sh_x=dev(4 * max(ish, 4)), edown=dev(2 * k * h), sdown=dev(2 * h))))

    def named(self, layer: int, taps: bool) -> dict:
        """moe_layer's named arguments for layer `layer` (taps: this layer's own intermediates)."""
        L = self.layers[layer]
        none = dict.fromkeys(("logits", "topk_w", "topk_id", "dn_codes", "dn_scales", "sh_x", "edown", "sdown"))
        return dict(xn=L["xn"], w_router=L["w_router"], bias=L["bias"], routed_scale=2.5, gamma_gu=1 / 2688,
                    gu_codes=self.gu[0], gu_scales=self.gu[1], gu_sg=self.gu[2], gamma_dn=1 / 2688, limit=10.0,
                    dn_codes_w=self.dn[0], dn_scales_w=self.dn[1], dn_sg=self.dn[2], sh_codes=L["sh"][0],
                    sh_scales=L["sh"][1], sh_sg=1 / 64, shd_codes=L["shd"][0], shd_scales=L["shd"][1], shd_sg=1 / 64,
                    y=L["y"], prefetch_rows=self.shape.hidden // 4, egu=None, sgu=None,
                    **(dict(none, logits=None, **L["taps"]) if taps else none))


# ------------------------------------------------------------------ isolated

def isolated(name: str, s: MoeLayerShape, phases: tuple[int, ...]) -> Case:
    g, d = phase_bytes(s)
    nbytes = sum((g, d)[p] for p in phases)

    def setup():
        from kbpc.testing import moe_layer  # noqa: PLC0415
        (run,) = moe_layer.load([plan_moe_layer(s, moe_layer.sm_count())])
        bufs = Layers(s)
        plans = (run.plan.gate_up, run.plan.down)
        if phases == (1,):   # phase 1 alone reads what phase 0 left in each layer's taps
            for layer in range(LAYERS):
                run.launch((plans[0].grid, 1, 1), (256, 1, 1), *run.args(0, **bufs.named(layer, True)),
                           smem=plans[0].smem, sync=True)

        def launch(i):
            named = bufs.named(i % LAYERS, True)
            for p in phases:
                run.launch((plans[p].grid, 1, 1), (256, 1, 1), *run.args(p, **named), smem=plans[p].smem, sync=False)
        return launch

    what = {(0, 1): "both phases", (0,): "phase 0: router, top-k, gate_up", (1,): "phase 1: down, combine"}[phases]
    return Case(f"glm_moe_layer::moe_layer {what} ({name})", f"top{s.top_k}/{s.experts} {s.hidden}x{s.inter}",
                nbytes, setup)


# ------------------------------------------------------------------ in-graph

LAYER_FIELDS = ([(f, "<u8") for f in ("xsrc", "w_router", "xn", "bias", "gu_codes", "gu_scales", "gu_sg", "dn_codes_w",
                                      "dn_scales_w", "dn_sg", "sh_codes", "sh_scales", "shd_codes", "shd_scales", "y")]
                + [(f, "<f4") for f in ("routed_scale", "gamma_gu", "gamma_dn", "limit", "sh_sg", "shd_sg")]
                + [("ids", "<i4", (32,))])


def _library(s: MoeLayerShape, plan) -> ctypes.CDLL:
    from kbpc.toolchain.nvcc import compile_cuda  # noqa: PLC0415
    from kbpc.targets import get_target  # noqa: PLC0415
    from kbpc.testing.gpu import _CACHE_DIR, headers_digest  # noqa: PLC0415

    defines = (f"-DMOE_H={s.hidden}", f"-DMOE_I={s.inter}", f"-DMOE_ISH={s.shared_inter}", f"-DMOE_E={s.experts}",
               f"-DMOE_TOPK={s.top_k}", f"-DMOE_PG={plan.gate_up.parts}", f"-DMOE_SG={plan.gate_up.stages}",
               f"-DMOE_PD={plan.down.parts}", f"-DMOE_SD={plan.down.stages}")
    src = BENCH_DIR / "moe_layer_graph.cu"
    key = hashlib.sha256(f"{src.read_text()}\0{defines}\0{headers_digest()}".encode()).hexdigest()[:20]
    lib = _CACHE_DIR / f"moe-graph-{key}.so"
    if not lib.exists():
        compile_cuda(src, lib, get_target("sm_90"), kind="shared", extra_flags=defines)
    dll = ctypes.CDLL(str(lib))
    dll.moe_bench_build.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong,
                                    ctypes.POINTER(ctypes.c_void_p)]
    dll.moe_bench_launch.argtypes = dll.moe_bench_free.argtypes = [ctypes.c_void_p]
    return dll


def _packed(bufs: Layers) -> np.ndarray:
    out = np.zeros(LAYERS, np.dtype(LAYER_FIELDS))
    for l, L in enumerate(bufs.layers):
        ptr = lambda a: 0 if a is None else int(a.gpudata)  # noqa: E731
        row = out[l]
        for f, a in (("xsrc", L["xsrc"]), ("w_router", L["w_router"]), ("xn", L["xn"]), ("bias", L["bias"]),
                     ("gu_codes", bufs.gu[0]), ("gu_scales", bufs.gu[1]), ("gu_sg", bufs.gu[2]),
                     ("dn_codes_w", bufs.dn[0]), ("dn_scales_w", bufs.dn[1]), ("dn_sg", bufs.dn[2]),
                     ("sh_codes", L["sh"][0]), ("sh_scales", L["sh"][1]), ("shd_codes", L["shd"][0]),
                     ("shd_scales", L["shd"][1]), ("y", L["y"])):
            row[f] = ptr(a)
        row["routed_scale"], row["gamma_gu"], row["gamma_dn"], row["limit"] = 2.5, 1 / 2688, 1 / 2688, 10.0
        row["sh_sg"] = row["shd_sg"] = 1 / 64
        row["ids"][:bufs.shape.top_k] = L["ids"]
    return out


def in_graph(name: str, s: MoeLayerShape, mode: int, pdl: bool = True) -> Case:
    g, d = phase_bytes(s)
    what = {0: "fused, in graph", 1: "streaming read of the same bytes, in graph", 2: "unfused chain, in graph"}[mode]

    def setup():
        from kbpc.testing import moe_layer  # noqa: PLC0415
        plan = plan_moe_layer(s, moe_layer.sm_count())
        dll = _library(s, plan)
        bufs = Layers(s)
        table = _packed(bufs)
        if dll.moe_bench_layer_bytes() != table.dtype.itemsize:
            raise RuntimeError(f"MoeBenchLayer is {dll.moe_bench_layer_bytes()} bytes, the table {table.dtype.itemsize}")
        handle = ctypes.c_void_p()
        err = dll.moe_bench_build(table.ctypes.data, LAYERS, mode, int(pdl), plan.gate_up.grid, plan.down.grid,
                                  plan.gate_up.smem, plan.down.smem, ctypes.byref(handle))
        if err:
            raise RuntimeError(f"building the graph failed: CUDA error {err}")

        class Replay:  # frees the graph when the runner drops the launch callable
            def __call__(self, i):
                e = dll.moe_bench_launch(handle)
                if e:
                    raise RuntimeError(f"graph launch failed: CUDA error {e}")

            def __del__(self):
                dll.moe_bench_free(handle)
                del bufs.layers[:]
        return Replay()

    return Case(f"glm_moe_layer::{what} ({name}, {LAYERS} layers)", f"top{s.top_k}/{s.experts} {s.hidden}x{s.inter}",
                LAYERS * (g + d), setup)


def moe_cases() -> list[Case]:
    cases = []
    for name, s in (("288 experts", MoeLayerShape(4096, 2048, 2048, 288, 8)),
                    ("128 experts", MoeLayerShape(4096, 2048, 2048, 128, 8))):
        cases += [isolated(name, s, (0, 1)), isolated(name, s, (0,)), isolated(name, s, (1,))]
        cases += [in_graph(name, s, mode) for mode in (0, 1, 2)]
    return cases
