"""Benchmark cases for the KDA kernels and the norms at the seed's shapes (see bench/kernels.py).

A KDA layer's decode work here is pack + conv + gates + recurrence + o_norm; the recurrent state
(64 x 128 x 128 x 4 B, read and written) dominates its bytes. Budget: <= 5 us for the layer. The
fused kernel (kernels/kda_fused.cuh, two splits, with and without PDL between launches) is timed
against the five unfused product kernels launched back to back, over the same byte floor.

    python3 bench/kernels.py --only kda
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import Case, rotations  # noqa: E402

H, DK, W = 64, 128, 4          # KDA heads, head width, conv width (the seed)
N = H * DK                     # 8192
C = 3 * N                      # packed q|k|v channels
KR = 128                       # gate rank


def _rand(shape, dtype):
    rng = np.random.default_rng(0)
    if dtype == np.uint16:  # BF16 bits of N(0, 1) values
        from kbpc.reference.formats import bf16_bits  # noqa: PLC0415
        return bf16_bits(rng.standard_normal(shape).astype(np.float32))
    if dtype == np.uint8:   # E4M3 codes, never the NaN codes 0x7F / 0xFF
        return (rng.integers(0, 0x7E, shape) | (rng.integers(0, 2, shape) << 7)).astype(np.uint8)
    return (rng.standard_normal(shape) * 0.1).astype(dtype)


def _case(name, shape, nbytes, instance_fn, arrays, args_fn, block, grid):
    """The product kernel instance_fn() (kbpc.testing.instances) through the product launcher.
    arrays: {key: (shape, dtype, rotate)}; args_fn(bufs) -> kernel arguments for one set."""
    def setup():
        from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        run = launcher(instance_fn())
        sets = rotations(nbytes)
        fixed = {k: to_gpu(_rand(s, d)) for k, (s, d, rot) in arrays.items() if not rot}
        rot = [{k: to_gpu(_rand(s, d)) for k, (s, d, r) in arrays.items() if r} for _ in range(sets)]
        argsets = [args_fn({**fixed, **r}) for r in rot]

        def launch(i):
            run(grid, block, *argsets[i % sets], sync=False)
        launch.keep = (fixed, rot)   # the argument sets point into these: keep them alive
        return launch
    return Case(name=name, shape=shape, bytes_moved=nbytes, setup=setup)


def _p(buf, off=0):
    return np.uintp(int(buf.gpudata) + off * buf.dtype.itemsize)


I32, I64, F = np.int32, np.int64, np.float32
BF, FP = np.uint16, np.float32


def _cases():
    from kbpc.codegen.families.kda_gates_w8a8 import gate_blocks  # noqa: PLC0415
    from kbpc.reference import rms_norm as ref_rms  # noqa: PLC0415
    from kbpc.testing import instances as ki  # noqa: PLC0415
    out = [
        _case("kda_pack::kda_pack_qkv_bf16", f"3x{N} -> {C} bf16", 4 * C, lambda: ki.kda_pack(N, N, N),
              {"q": ((N,), BF, 1), "k": ((N,), BF, 1), "v": ((N,), BF, 1), "o": ((C,), BF, 1)},
              lambda b: (b["q"], b["k"], b["v"], I32(N), I32(N), I32(N), b["o"], I32(C)),
              (256, 1, 1), (-(-C // 8 // 256), 1)),
        _case("causal_conv1d_l2norm::update_l2norm", f"{C} ch, w{W}, bf16 out", C * (2 + 32 + 2 * W + 2 + 2),
              lambda: ki.causal_conv(C, 2 * N, DK, W, 256),
              {"x": ((C,), BF, 1), "win": ((C, W), FP, 1), "taps": ((C, W), BF, 0), "bias": ((C,), BF, 0),
               "y": ((C,), BF, 1)},
              lambda b: (b["x"], I32(C), b["win"], I64(C * W), b["taps"], b["bias"], F(1e-6), b["y"], I32(C)),
              (256, 1, 1), (C // 256, 1)),
        _case("kda_gates_w8a8::k128_rows m=1", f"2x{N}x{KR} e4m3",
              2 * N * KR + 2 * N * 4 + 2 * KR * 2 + H * 6 + N * 4 + N * 6 + H * 4,
              lambda: ki.kda_gates(N, KR, DK, 4),
              {"xf": ((KR,), BF, 1), "xg": ((KR,), BF, 1), "wf": ((N, KR), np.uint8, 1),
               "swf": ((N,), FP, 1), "wg": ((N, KR), np.uint8, 1), "swg": ((N,), FP, 1),
               "a": ((H,), FP, 0), "dt": ((N,), FP, 0), "b": ((H,), BF, 1), "decay": ((N,), FP, 1),
               "og": ((N,), BF, 1), "beta": ((H,), FP, 1)},
              lambda b: (b["xf"], b["xg"], I32(KR), I32(1), b["wf"], b["swf"], b["wg"], b["swg"], b["a"],
                         b["dt"], F(-5.0), b["b"], I32(H), b["decay"], I32(N), b["og"], I32(N), b["beta"],
                         I32(H), np.uintp(0), I32(N)),
              (128, 1, 1), (2 * gate_blocks(N, 4), 1)),
    ]
    for cols in (32, 64, 128):
        out.append(_case(f"kda_recurrent::seq_reg cols={cols}", f"{H}x{DK}x{DK} f32 state",
                         2 * H * DK * DK * 4 + C * 2 + N * 4 + H * 4 + N * 4,
                         lambda cols=cols: ki.kda_recurrent(H, H, DK, DK, cols, 1),
                         {"qkv": ((C,), BF, 1), "g": ((N,), FP, 1), "beta": ((H,), FP, 1),
                          "state": ((H, DK, DK), FP, 1), "out": ((N,), FP, 1)},
                         lambda b: (_p(b["qkv"]), _p(b["qkv"], N), _p(b["qkv"], 2 * N), I32(C), b["g"], I32(N),
                                    b["beta"], I32(H), F(DK ** -0.5), b["state"], I64(H * DK * DK),
                                    np.uintp(0), b["out"], I32(N)),
                         (cols, 1, 1), (H, DK // cols, 1)))
    out.append(_case("kda_o_norm::gated_bf16", f"{H}x{DK}", N * 4 + N * 2 + DK * 2 + N * 2,
                     lambda: ki.kda_o_norm(H, DK),
                     {"o": ((N,), FP, 1), "z": ((N,), BF, 1), "w": ((DK,), BF, 0), "y": ((N,), BF, 1)},
                     lambda b: (b["o"], I32(N), b["z"], I32(N), b["w"], I32(0), F(1e-6), b["y"], I32(N)),
                     (DK, 1, 1), (H, 1)))
    for d, one_plus in ((4096, True), (1536, False)):
        t = ref_rms.block_threads(d)
        out.append(_case(f"rms_norm::{'rms_norm' if one_plus else 'vanilla'}", f"1x{d} bf16", 3 * d * 2,
                         lambda d=d, t=t, one_plus=one_plus: ki.rms_norm(d, t, one_plus, 0),
                         {"x": ((d,), BF, 1), "w": ((d,), BF, 0), "y": ((d,), BF, 1)},
                         lambda b, d=d: (b["x"], I64(d), I64(d), np.uintp(0), I64(d), np.uintp(0), I64(d),
                                         b["w"], F(1e-6), b["y"], I64(d), I64(d)),
                         (t, 1, 1), (1, 1)))
    out.append(_case("layer_norm::layer_norm_bf16", "1x128 bf16 in place", 4 * 128 * 2,
                     lambda: ki.layer_norm(128, 128),
                     {"x": ((128,), BF, 1), "w": ((128,), BF, 0), "b": ((128,), BF, 0)},
                     lambda b: (b["x"], I64(128), b["w"], b["b"], F(1e-6), b["x"], I64(128)),
                     (128, 1, 1), (1, 1)))
    return out


def chain_bytes(d) -> int:
    """The unavoidable traffic of a KDA layer's non-projection chain of sizes d (a KdaDims): state
    and conv window read and written; taps, bias, gate weights and scales, A, delta and gamma read;
    the six projection rows read and the gated output written."""
    n, nv, c = d.hv * d.dk, d.hv * d.dv, d.channels
    state = 2 * d.hv * d.dk * d.dv * 4 + 2 * c * d.width * 4
    params = c * d.width * 2 + c * 2 + n * d.kf + n * 4 + nv * d.kg + nv * 4 + d.hv * 4 + n * 4 + d.dv * 2
    rows = (2 * d.hk * d.dk + nv + d.kf + d.kg + d.hv) * 2 + nv * 2
    return state + params + rows


def _seed_dims():
    from kbpc.codegen.families.kda_fused import KdaDims  # noqa: PLC0415
    return KdaDims(H, H, DK, DK, KR, KR, W)


def _fused_case(cph: int, pdl: bool) -> Case:
    d = _seed_dims()
    nbytes = chain_bytes(d)

    def setup():
        from kbpc.codegen.families.kda_fused import KdaShape, instance  # noqa: PLC0415
        from kbpc.testing.gpu import poisoned, to_gpu  # noqa: PLC0415
        from kbpc.testing.kda_chain import KdaLayerData, fused_args, upload  # noqa: PLC0415
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        shape = KdaShape(d, cph)
        run = launcher(instance(shape))
        rng = np.random.default_rng(0)
        sets = []
        for _ in range(rotations(nbytes)):
            data = KdaLayerData.random(rng, d, integer_gates=False)
            dev = upload(data, data.step_inputs(rng), to_gpu)
            sets.append(fused_args(d, dev, (1e-6, -5.0, 1e-5), {"y": poisoned((d.hv * d.dv,), np.uint16)}))

        def launch(i):
            run(shape.grid, shape.block, *sets[i % len(sets)], pdl=pdl, sync=False)
        return launch
    return Case(name=f"kda_fused::decode cph={cph}{' pdl' if pdl else ''}", shape=f"{H}x{DK}x{DK}, whole chain",
                bytes_moved=nbytes, setup=setup)


def _unfused_case(pdl: bool) -> Case:
    """The five product kernels of the seed's first KDA layer back to back (the sum the fused kernel
    replaces), on rotated parameter sets."""
    d = _seed_dims()
    nbytes = chain_bytes(d)

    def setup():
        from kbpc.testing.gpu import poisoned, to_gpu  # noqa: PLC0415
        from kbpc.testing.kda_chain import KdaLayerData, bind, product_chain  # noqa: PLC0415
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        seed = Path(__file__).resolve().parent.parent / "examples" / "glm-5.3-flash-nvfp4-tp3-512k.decode1.graph.json"
        chain = product_chain(str(seed))
        runs = [(launcher(l.instance), l) for l in chain.unfused]
        rng = np.random.default_rng(0)
        window, state = chain.state_names
        sets = []
        for _ in range(rotations(nbytes)):
            data = KdaLayerData.random(rng, chain.dims, integer_gates=False)
            arrays = {n: to_gpu(v) for n, v in data.named_weights(chain.block).items()}
            arrays.update({window: to_gpu(data.window), state: to_gpu(data.state)})
            arrays.update({chain.inputs[n]: to_gpu(v) for n, v in data.step_inputs(rng).items()})
            arrays.update({b.name: poisoned((b.elements,), np.uint16 if b.format == "bf16" else np.float32)
                           for b in chain.plan.buffers if b.name in chain.inner + (chain.gated,)})
            sets.append([bind(l, chain.plan, arrays) for _, l in runs] + [arrays])

        def launch(i):
            for (run, l), args in zip(runs, sets[i % len(sets)]):
                run(l.grid, l.block, *args, smem=l.smem, pdl=pdl, sync=False)
        return launch
    return Case(name=f"kda chain, 5 unfused kernels{' pdl' if pdl else ''}", shape=f"{H}x{DK}x{DK}, whole chain",
                bytes_moved=nbytes, setup=setup)


CASES = _cases() + [_fused_case(2, False), _fused_case(4, False), _fused_case(2, True), _unfused_case(False),
                    _unfused_case(True)]

if __name__ == "__main__":
    from kernels import main  # noqa: PLC0415
    sys.exit(main(["--only", "kda"] + sys.argv[1:]))
