"""Benchmark cases of the projection kernels at the seed blueprint's decode shapes (one token), and
of the fused MoE layer (bench/moe_layer_bench.py: isolated phases, and in a CUDA graph against a
streaming read of the same bytes and against the unfused chain).

Buffers are filled with a byte pattern (0x3C: BF16 ~0.0115, E4M3 1.5, E2M1 pairs 2 | 1.5): the
kernels' speed does not depend on values, and filling on the device keeps setup fast.
"""
from __future__ import annotations

import numpy as np

from kernels import Case, rotations
from moe_layer_bench import moe_cases

B256 = dict(block=(256, 1, 1))


def _dev(nbytes: int):
    import pycuda.driver as cuda  # noqa: PLC0415
    from pycuda import gpuarray  # noqa: PLC0415
    a = gpuarray.empty((max(nbytes, 16),), np.uint8)
    cuda.memset_d8(a.gpudata, 0x3C, a.nbytes)
    return a


def _mod(src: str, name: str):
    from kbpc.testing.gpu import load_module  # noqa: PLC0415
    return load_module("#include <cuda_bf16.h>\n" + src, name)


def _table(records: list[tuple], dtype: list) -> object:
    from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
    return to_gpu(np.array(records, np.dtype(dtype)).view(np.uint8))


# ------------------------------------------------------------------ dense / w4a16

def dense(name, n, k):
    def setup():
        f = _mod(f'#include "dense_bf16.cuh"\nextern "C" __global__ void __launch_bounds__(256) d(const __nv_bfloat16* W, const __nv_bfloat16* x, __nv_bfloat16* y, int N) {{ kbp::dense_gemv_bf16_dev<{k}, __nv_bfloat16>(W, x, y, N); }}', f"bd{k}").get_function("d")
        sets = [(_dev(2 * n * k), _dev(2 * k), _dev(2 * n)) for _ in range(rotations(2 * n * k))]
        def launch(i, stream=None):
            w, x, y = sets[i % len(sets)]
            f(w.gpudata, x.gpudata, y.gpudata, np.int32(n), grid=((n + 3) // 4, 1), stream=stream, **B256)
        return launch
    return Case(f"dense_bf16::gemv {name}", f"{n}x{k} bf16", 2 * n * k + 2 * k + 2 * n, setup)


def _nvfp4_bytes(n, k):
    return n * k // 2 + n * k // 16


def _w4a16_seg_launch(f, ns, k, wb, grid, block):
    """launch(i, stream) of a W4A16Seg-table kernel f(table, nseg, x) over rotating weight sets."""
    dt = [("c", "<u8"), ("s", "<u8"), ("y", "<u8"), ("g", "<f4"), ("n", "<i4")]
    sets = []
    for _ in range(rotations(wb)):
        bufs = [(_dev(n * k // 2), _dev(n * k // 16), _dev(2 * n)) for n in ns]
        tab = _table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), 1.0, n) for (c, s, y), n in zip(bufs, ns)], dt)
        sets.append((bufs, tab, _dev(2 * k)))

    def launch(i, stream=None):
        _, tab, x = sets[i % len(sets)]
        f(tab.gpudata, np.int32(len(ns)), x.gpudata, grid=grid, block=block, stream=stream)
    return launch


def w4a16_segs(name, ns, k):
    """One launch of w4a16_gemv_seg (or w4a16_gemv when there is one segment)."""
    wb = sum(_nvfp4_bytes(n, k) for n in ns)

    def setup():
        mod = _mod(f'#include "w4a16_gemv.cuh"\n'
                   f'extern "C" __global__ void __launch_bounds__(256) s(const kbp::W4A16Seg* t, int n, const __nv_bfloat16* x) {{ kbp::w4a16_gemv_seg_dev<{k}>(t, n, x); }}', f"bw4s{k}")
        return _w4a16_seg_launch(mod.get_function("s"), ns, k, wb, (sum((n + 15) // 16 for n in ns), 1), (256, 1, 1))
    return Case(f"w4a16_gemv::seg {name}", f"{'+'.join(map(str, ns))}x{k} nvfp4", wb + 2 * k + 2 * sum(ns), setup)


def w4a16_silu(name, n, k):
    def setup():
        f = _mod(f'#include "w4a16_gemv.cuh"\nextern "C" __global__ void __launch_bounds__(256) s(const uint8_t* c, const uint8_t* s, float g, const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* y, int N) {{ kbp::w4a16_gemv_silu_input_dev<{k}>(c, s, g, a, b, y, N); }}', f"bw4si{k}").get_function("s")
        sets = [(_dev(n * k // 2), _dev(n * k // 16), _dev(2 * k), _dev(2 * k), _dev(2 * n)) for _ in range(rotations(_nvfp4_bytes(n, k)))]

        def launch(i):
            c, s, a, b, y = sets[i % len(sets)]
            f(c.gpudata, s.gpudata, np.float32(1), a.gpudata, b.gpudata, y.gpudata, np.int32(n), grid=((n + 15) // 16, 1), **B256)
        return launch
    return Case(f"w4a16_gemv::silu_input {name}", f"{n}x{k} nvfp4", _nvfp4_bytes(n, k) + 4 * k + 2 * n, setup)


def w4a16_pair(name, k, i, n, fast):
    """A shared expert's two launches (phase 0 then phase 1, PDL on the second as in the step)
    through the product launcher with the lowering's instance, grids and blocks: the exact pair
    (w4a16_shared_pair) or the fast tensor-core pair (w4a16_mma_shared_pair)."""
    from kbpc.codegen.families import w4a16_gemv as low  # noqa: PLC0415
    wb = _nvfp4_bytes(2 * i, k) + _nvfp4_bytes(n, i)
    shapes = low.pair_shapes(k, i, n) if fast else None
    if fast:
        g0, b0, g1, b1 = low.pair_launch_shapes(i, n, shapes)
    else:
        g0, b0, g1, b1 = (low.ctas(2 * i), 1, 1), B256["block"], (low.ctas(n), 1, 1), B256["block"]

    def setup():
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(low.pair_instance(k, i, shapes))
        sets = [(_dev(2 * i * k // 2), _dev(2 * i * k // 16), _dev(n * i // 2), _dev(n * i // 16))
                for _ in range(rotations(wb))]
        x, y = _dev(2 * k), _dev(2 * n)

        def launch(r, stream=None):
            gc, gs, dc, ds = sets[r % len(sets)]
            args = (gc, gs, 1.0, x, dc, ds, 1.0, 10.0, y, n)
            run(g0, b0, 0, *args, pdl=True, sync=False, stream=stream)
            run(g1, b1, 1, *args, pdl=True, sync=False, stream=stream)
        return launch
    form = f"w4a16_mma_shared_pair {shapes}" if fast else "w4a16_shared_pair"
    return Case(f"w4a16_gemv::{form} {name}", f"{2 * i}x{k} + {n}x{i} nvfp4", wb + 2 * k + 2 * n, setup)


# ------------------------------------------------------------------ w4a4

def _expert_stacks(slots, n, k):
    """(rotations, codes, scales, tensor scales, ids per rotation) of `slots` distinct NVFP4 experts
    per launch, rotated so consecutive launches read more than the L2 holds."""
    from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
    rot = rotations(slots * _nvfp4_bytes(n, k))
    experts = slots * rot
    ids = [to_gpu(np.arange(r * slots, (r + 1) * slots, dtype=np.int32)) for r in range(rot)]
    return (rot, _dev(experts * n * k // 2), _dev(experts * n * k // 16), to_gpu(np.ones(experts, np.float32)), ids)


def w4a4_slots(name, n, k, slots, shared):
    """Routed-expert slot GEMV: `slots` distinct experts per launch, ids read on the device."""
    wb = slots * _nvfp4_bytes(n, k)

    def setup():
        f = _mod(f'#include "w4a4_mx_static.cuh"\nextern "C" __global__ void __launch_bounds__(256, 2) m(const int* ids, int div, const uint8_t* ac, const uint8_t* as, const float* ag, const uint8_t* wc, const uint8_t* ws, const float* sg, __nv_bfloat16* y, int N) {{ kbp::w4a4_gemv_moe_slots_dev<{k}>(ids, div, ac, as, ag, wc, ws, sg, y, N); }}', f"bw44m{k}").get_function("m")
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        rot, wc, ws, sg, ids = _expert_stacks(slots, n, k)
        rows = 1 if shared else slots
        ac, asc, ag = _dev(rows * k // 2), _dev(rows * k // 16), to_gpu(np.ones(rows, np.float32))
        y = _dev(2 * slots * n)

        def launch(i):
            f(ids[i % rot].gpudata, np.int32(slots if shared else 1), ac.gpudata, asc.gpudata, ag.gpudata,
              wc.gpudata, ws.gpudata, sg.gpudata, y.gpudata, np.int32(n), grid=(n // 16, slots), **B256)
        return launch
    return Case(f"w4a4_mx_static::moe_slots {name}", f"{slots}x {n}x{k} nvfp4", wb + 2 * slots * n, setup)


def w4a4_slots_launcher(name, n, k, slots, shared, fast=False, tiles=None):
    """The step's slot GEMV (w4a4_gemv_moe_slots, its own launch bounds) through the product
    launcher, on rows quantized once; "moe_slots" above is the same body built at 2 CTAs per SM.
    fast: the numerics-fast form (FP32 accumulation); tiles: 16-row tiles a CTA (default: the
    lowering's, w4a4_mx_static.slot_tiles)."""
    from kbpc.codegen.families.w4a4_mx_static import slot_tiles  # noqa: PLC0415
    from kbpc.testing.instances import w4a4_moe_slots  # noqa: PLC0415
    wb, rows = slots * _nvfp4_bytes(n, k), 1 if shared else slots
    tiles = slot_tiles(k, n) if tiles is None else tiles

    def setup():
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(w4a4_moe_slots(k, fast, tiles))
        rot, wc, ws, sg, ids = _expert_stacks(slots, n, k)
        ac, asc, ag = _dev(rows * k // 2), _dev(rows * k // 16), to_gpu(np.ones(rows, np.float32))
        y = _dev(2 * slots * n)

        def launch(i, stream=None):
            run((n // (16 * tiles), slots), (256, 1, 1), ids[i % rot], slots // rows, ac, asc, ag, wc, ws, sg, y, n,
                pdl=True, sync=False, stream=stream)
        return launch
    form = ("fast step form" if fast else "step form") + (f", {tiles} tiles a CTA" if tiles > 1 else "")
    return Case(f"w4a4_mx_static::moe_slots ({form}) {name}", f"{slots}x {n}x{k} nvfp4", wb + 2 * slots * n, setup)


def w4a4_slots_bf16(name, n, k, slots, shared):
    """The routed slot GEMV quantizing its BF16 row in every CTA (w4a4_gemv_moe_slots_bf16: the
    step's form before 2026-12-01, beside the quantize-once pair the step launches now)."""
    from kbpc.testing.instances import w4a4_moe_slots_bf16  # noqa: PLC0415
    wb, rows = slots * _nvfp4_bytes(n, k), 1 if shared else slots

    def setup():
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(w4a4_moe_slots_bf16(k))
        rot, wc, ws, sg, ids = _expert_stacks(slots, n, k)
        x, y = _dev(2 * rows * k), _dev(2 * slots * n)

        def launch(i, stream=None):
            run((n // 16, slots), (256, 1, 1), ids[i % rot], slots // rows, x, 1.0, wc, ws, sg, y, n, pdl=True,
                sync=False, stream=stream)
        return launch
    return Case(f"w4a4_mx_static::moe_slots_bf16 {name}", f"{slots}x {n}x{k} nvfp4", wb + 2 * rows * k + 2 * slots * n,
                setup)


def w4a4_quant_swiglu(rows, k):
    """The down projection's input rows: SwiGLU + NVFP4 quantization, one value a thread."""
    from kbpc.codegen.families.w4a4_mx_static import quant_swiglu_grid  # noqa: PLC0415
    from kbpc.testing.instances import w4a4_quant_swiglu_rows_static  # noqa: PLC0415
    inst = w4a4_quant_swiglu_rows_static(k)

    def setup():
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(inst)
        sets = [(_dev(rows * 4 * k), _dev(rows * k // 2), _dev(rows * k // 16), _dev(4 * rows))
                for _ in range(rotations(rows * 4 * k))]

        def launch(i, stream=None):
            gu, c, sc, g = sets[i % len(sets)]
            run(quant_swiglu_grid(k, rows), (256, 1, 1), gu, 7.0, 1.0, c, sc, g, pdl=True, sync=False, stream=stream)
        return launch
    return Case("w4a4_mx_static::quant_swiglu_rows", f"{rows}x{k}", rows * (4 * k + k // 2 + k // 16 + 4), setup)


def w4a4_dense(name, n, k, fast=False):
    """The dense MLP's W4A4 GEMV (w4a4_gemv through the product launcher; fast: FP32 accumulation)."""
    from kbpc.testing.instances import w4a4_gemv  # noqa: PLC0415

    def setup():
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(w4a4_gemv(k, fast))
        ag = to_gpu(np.ones(1, np.float32))
        sets = [(_dev(k // 2), _dev(k // 16), _dev(n * k // 2), _dev(n * k // 16), _dev(2 * n)) for _ in range(rotations(_nvfp4_bytes(n, k)))]

        def launch(i, stream=None):
            ac, asc, wc, ws, y = sets[i % len(sets)]
            run((n // 16, 1), (256, 1, 1), ac, asc, ag, wc, ws, 1.0, y, n, pdl=True, sync=False, stream=stream)
        return launch
    return Case(f"w4a4_mx::gemv{' fast' if fast else ''} {name}", f"{n}x{k} nvfp4", _nvfp4_bytes(n, k) + 2 * n, setup)


# ------------------------------------------------------------------ wxay

def wxay_split(name, ns, k):
    wb = sum(n * k + 4 * n for n in ns)

    def setup():
        f = _mod(f'#include "wxay.cuh"\nextern "C" __global__ void __launch_bounds__(256, 2) s(const kbp::WxaySeg* t, int n, const uint8_t* a, const float* sa) {{ kbp::wxay_rowscale_split_dev<{k}>(t, n, a, sa); }}', f"bwx{k}").get_function("s")
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        dt = [("w", "<u8"), ("s", "<u8"), ("y", "<u8"), ("n", "<i4"), ("p", "<i4")]
        sa = to_gpu(np.ones(1, np.float32))
        sets = []
        for _ in range(rotations(wb)):
            bufs = [(_dev(n * k), to_gpu(np.ones(n, np.float32)), _dev(2 * n)) for n in ns]
            tab = _table([(int(w.gpudata), int(s.gpudata), int(y.gpudata), n, 0) for (w, s, y), n in zip(bufs, ns)], dt)
            sets.append((bufs, tab, _dev(k)))
        grid = (sum(n // 16 for n in ns), 1)

        def launch(i, stream=None):
            _, tab, a = sets[i % len(sets)]
            f(tab.gpudata, np.int32(len(ns)), a.gpudata, sa.gpudata, grid=grid, stream=stream, **B256)
        return launch
    return Case(f"wxay::rowscale {name}", f"{'+'.join(map(str, ns))}x{k} fp8", wb + k + 2 * sum(ns), setup)


# ------------------------------------------------------------------ fast / small-N forms

def w4a16_mma(name, ns, k, ks, t):
    """One launch of the FP16 tensor-core form (w4a16_mma_seg; one segment = w4a16_mma)."""
    wb = sum(_nvfp4_bytes(n, k) for n in ns)

    def setup():
        mod = _mod(f'#include "w4a16_mma.cuh"\n'
                   f'extern "C" __global__ void __launch_bounds__({32 * ks * t}) s(const kbp::W4A16Seg* t, int n, const __nv_bfloat16* x) {{ kbp::w4a16_mma_seg_dev<{k}, {ks}, {t}>(t, n, x); }}', f"bw4m{k}_{ks}_{t}")
        return _w4a16_seg_launch(mod.get_function("s"), ns, k, wb, (sum(-(-n // (16 * t)) for n in ns), 1),
                                 (32 * ks * t, 1, 1))
    return Case(f"w4a16_mma::seg {name} KS{ks} T{t}", f"{'+'.join(map(str, ns))}x{k} nvfp4", wb + 2 * k + 2 * sum(ns), setup)


def wxay_ks(name, ns, k, w):
    """wxay_rowscale_split_ks: W warps per CTA, 8/W CTAs per 16-row tile (same bits as wxay)."""
    wb = sum(n * k + 4 * n for n in ns)
    tiles = sum(n // 16 for n in ns)

    def setup():
        f = _mod(f'#include "wxay.cuh"\nextern "C" __global__ void __launch_bounds__({32 * w}) s(const kbp::WxaySeg* t, int n, const uint8_t* a, const float* sa, float* part, unsigned* cnt) {{ kbp::wxay_rowscale_split_ks_dev<{k}, {w}>(t, n, a, sa, part, cnt); }}', f"bwxks{k}_{w}").get_function("s")
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        dt = [("w", "<u8"), ("s", "<u8"), ("y", "<u8"), ("n", "<i4"), ("p", "<i4")]
        sa = to_gpu(np.ones(1, np.float32))
        part, cnt = _dev(4 * 128 * tiles), to_gpu(np.zeros(tiles, np.uint32))
        sets = []
        for _ in range(rotations(wb)):
            bufs = [(_dev(n * k), to_gpu(np.ones(n, np.float32)), _dev(2 * n)) for n in ns]
            tab = _table([(int(w_.gpudata), int(s_.gpudata), int(y.gpudata), n, 0) for (w_, s_, y), n in zip(bufs, ns)], dt)
            sets.append((bufs, tab, _dev(k)))

        def launch(i, stream=None):
            _, tab, a = sets[i % len(sets)]
            f(tab.gpudata, np.int32(len(ns)), a.gpudata, sa.gpudata, part.gpudata, cnt.gpudata,
              grid=(tiles * (8 // w), 1), block=(32 * w, 1, 1), stream=stream)
        return launch
    return Case(f"wxay::rowscale_ks {name} W{w}", f"{'+'.join(map(str, ns))}x{k} fp8", wb + k + 2 * sum(ns), setup)


def dense_opc(name, n, k, opc, out="float"):
    ob = 4 if out == "float" else 2

    def setup():
        f = _mod(f'#include "dense_bf16.cuh"\nextern "C" __global__ void __launch_bounds__({64 * opc}) d(const __nv_bfloat16* W, const __nv_bfloat16* x, {out}* y, int N) {{ kbp::dense_gemv_bf16_dev<{k}, {out}, {opc}>(W, x, y, N); }}', f"bdo{k}_{opc}_{ob}").get_function("d")
        sets = [(_dev(2 * n * k), _dev(2 * k), _dev(ob * n)) for _ in range(rotations(2 * n * k))]

        def launch(i, stream=None):
            w, x, y = sets[i % len(sets)]
            f(w.gpudata, x.gpudata, y.gpudata, np.int32(n), grid=(-(-n // opc), 1), block=(64 * opc, 1, 1), stream=stream)
        return launch
    return Case(f"dense_bf16::gemv_opc {name} OPC{opc}", f"{n}x{k} bf16", 2 * n * k + 2 * k + ob * n, setup)


# ------------------------------------------------------------------ activation quantizers

def quantizer(name, entry, header, k, in_bytes, out_bytes, args, ctas=1):
    """One row through `entry`'s body, `ctas` CTAs (grid.y) for it."""
    def setup():
        f = _mod(f'#include "{header}"\nextern "C" __global__ void __launch_bounds__(256) q({args[0]}) {{ kbp::{entry}_dev<{k}>({args[1]}); }}', f"bq{entry}{k}").get_function("q")
        sets = [[_dev(b) for b in args[2]] for _ in range(rotations(in_bytes))]

        def launch(i):
            f(*(b.gpudata for b in sets[i % len(sets)]), grid=(1, ctas), **B256)
        return launch
    return Case(f"{header[:-4]}::{entry} {name}", f"1x{k}", in_bytes + out_bytes, setup)


def w8a8_row_launcher(name, k, form):
    """The step's per-token FP8 quantizer through the product launcher, one row: form "split"
    (w8a8_act_quant_row<K, SPLIT>, SPLIT CTAs each reading the whole row for its max) or "cluster"
    (w8a8_act_quant_row_cluster<K, CL>, the maxima met in distributed shared memory), each at the
    lowering's width for Hopper. The row is nonzero BF16 (0x3C3C), so every value is encoded."""
    from kbpc.codegen.families.w8a8_act_quant import row_cluster, row_split  # noqa: PLC0415
    from kbpc.testing.instances import w8a8_quant, w8a8_quant_cluster  # noqa: PLC0415
    width = row_cluster(k, 16) if form == "cluster" else row_split(k)
    inst = w8a8_quant_cluster(k, width) if form == "cluster" else w8a8_quant(k, "row", width)
    grid = (width, 1) if form == "cluster" else (1, width)

    def setup():
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(inst)
        sets = [(_dev(2 * k), _dev(k), _dev(4)) for _ in range(rotations(2 * k))]

        def launch(i, stream=None):
            x, q, sc = sets[i % len(sets)]
            run(grid, (256, 1, 1), x, q, sc, pdl=True, sync=False, stream=stream)
        return launch
    return Case(f"w8a8_act_quant::row ({form}, {width} CTAs) {name}", f"1x{k}", 2 * k + k + 4, setup)


_BF = "const __nv_bfloat16*"
CASES = [
    dense("lm_head", 154880, 4096),
    w4a16_segs("kda q", (8192,), 4096),
    w4a16_segs("kda o", (4096,), 8192),
    w4a16_segs("kda six q,k,v,f_a,b,g_a", (8192, 8192, 8192, 128, 64, 128), 4096),
    w4a16_segs("shared expert gate,up", (2048, 2048), 4096),
    w4a16_silu("shared expert down", 4096, 2048),
    w4a16_pair("shared expert (2 launches)", 4096, 2048, 4096, fast=False),
    w4a16_pair("shared expert (2 launches)", 4096, 2048, 4096, fast=True),
    w4a4_slots("moe gate_up (8 slots)", 4096, 4096, 8, True),
    w4a4_slots("moe down (8 slots)", 4096, 2048, 8, False),
    w4a4_slots_launcher("moe gate_up (8 slots)", 4096, 4096, 8, True),
    w4a4_slots_launcher("moe down (8 slots)", 4096, 2048, 8, False),
    w4a4_slots_launcher("moe gate_up (8 slots)", 4096, 4096, 8, True, fast=True),
    w4a4_slots_launcher("moe down (8 slots)", 4096, 2048, 8, False, fast=True),
    w4a4_slots_launcher("moe down (8 slots)", 4096, 2048, 8, False, fast=True, tiles=1),
    w4a4_slots_bf16("moe gate_up (8 slots)", 4096, 4096, 8, True),
    w4a4_slots_bf16("moe down (8 slots)", 4096, 2048, 8, False),
    w4a4_quant_swiglu(8, 2048),
    w4a4_dense("dense mlp gate_up", 24576, 4096),
    w4a4_dense("dense mlp down", 4096, 12288),
    w4a4_dense("dense mlp gate_up", 24576, 4096, fast=True),
    w4a4_dense("dense mlp down", 4096, 12288, fast=True),
    wxay_split("dsa q_a", (1536,), 4096),
    wxay_split("dsa kv_a", (512,), 4096),
    wxay_split("dsa q_a+kv_a split", (1536, 512), 4096),
    wxay_split("dsa q_b", (16384,), 1536),
    wxay_split("dsa o", (4096,), 16384),
    wxay_split("index k/gate", (128,), 4096),
    wxay_ks("dsa q_a+kv_a split", (1536, 512), 4096, 4),
    wxay_ks("index k/gate", (128,), 4096, 1),
    wxay_ks("dsa kv_a", (512,), 4096, 2),
    w4a16_mma("kda q", (8192,), 4096, 4, 2),
    w4a16_mma("kda o", (4096,), 8192, 8, 1),
    w4a16_mma("kda six q,k,v,f_a,b,g_a", (8192, 8192, 8192, 128, 64, 128), 4096, 4, 2),
    w4a16_mma("shared expert gate,up", (2048, 2048), 4096, 8, 1),
    w4a16_mma("shared expert down", (4096,), 2048, 4, 2),
    dense("router", 288, 4096),
    dense_opc("router", 288, 4096, 1),
    dense("index q", 4096, 1536),
    dense_opc("index q", 4096, 1536, 2),
    dense("index k (bf16 out)", 128, 4096),
    dense_opc("index k (bf16 out)", 128, 4096, 1, "__nv_bfloat16"),
    dense_opc("index weights", 32, 4096, 1),
    quantizer("", "w4a4_quant_rows", "w4a4_mx.cuh", 4096, 8192, 4096 // 2 + 4096 // 16 + 4,
              (f"{_BF} x, uint8_t* c, uint8_t* s, float* g", "x, c, s, g", (8192, 2048, 256, 4)),
              ctas=-(-4096 // 256)),   # the product's split: one value a thread (w4a4_mx.quant_split)
    quantizer("", "w8a8_act_quant_row", "w8a8_act_quant.cuh", 4096, 8192, 4096 + 4,
              (f"{_BF} x, uint8_t* q, float* s", "x, q, s", (8192, 4096, 4))),
    w8a8_row_launcher("dsa output row", 16384, "split"),
    w8a8_row_launcher("dsa output row", 16384, "cluster"),
    w8a8_row_launcher("dsa input row", 4096, "split"),
    w8a8_row_launcher("dsa input row", 4096, "cluster"),
    quantizer("", "w8a8_act_quant_silu_row", "w8a8_act_quant.cuh", 12288, 4 * 12288, 12288 + 4,
              (f"{_BF} g, {_BF} u, uint8_t* q, float* s", "g, u, q, s", (2 * 12288, 2 * 12288, 12288, 4))),
    quantizer("", "w8a8_act_quant_g128", "w8a8_act_quant.cuh", 16384, 2 * 16384, 16384 + 4 * 128,
              (f"{_BF} x, uint8_t* q, float* s", "x, q, s", (2 * 16384, 16384, 4 * 128))),
]
CASES += moe_cases()
