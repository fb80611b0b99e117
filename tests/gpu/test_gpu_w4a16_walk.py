"""GPU tests of the fast W4A16 walk (kernels/w4a16_mma_walk.cuh: a grid sized to the GPU whose warps
stream all tiles through a ring of loads), launched through the product launchers
(kbpc.testing.launchers) on fresh random inputs.

What is checked, per output:
- the fast form's stated bound against the reference (kbpc.reference.gemv_bounds.w4a16_mma_bound
  with the launch's KS, derivation in that module and in test_gpu_w4a16_mma.py), and >= 90% of the
  outputs equal to the reference's BF16 bits (assert_fast_bound);
- the same bits as the one-wave w4a16_mma with the same KS: the walk changes the schedule only (same
  chunk MMAs in the same order per warp, partials added in warp order, same x staging), so any
  grid, T and ring depth must give identical outputs;
- replays (PDL launches back to back without synchronizing) give identical bits.
Shapes: the seed's fast launches (KDA q,k,v,f_a,b,g_a in one launch, o, q alone, the shared expert's
gate/up and down shapes) with the schedule the lowering picks for sm_90, and small odd shapes (N not a
multiple of 16, several segments, K % 128 != 0, KS above the chunk count) under schedules that make
one CTA walk every tile, leave slots idle, or run a one-deep ring.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import w4a16_gemv as lw
from kbpc.reference.formats import bf16_bits
from kbpc.targets import get_target

from test_gpu_projections import W4A16_SEG, _gpu, bf16_input, nvfp4_weight, seg_table
from test_gpu_w4a16_mma import assert_fast_bound

pytestmark = pytest.mark.gpu

SMS = get_target("sm_90").sms
SEED_SHAPES = [((8192, 8192, 8192, 128, 64, 128), 4096), ((4096,), 8192), ((8192,), 4096), ((2048, 2048), 4096),
               ((4096,), 2048)]


def _tiles(ns) -> int:
    return sum(lw.ctas(n) for n in ns)


def _nseg(ns) -> int:
    return len(ns) if len(ns) > 1 else 0


class Problem:
    """x and the weights of widths ns on the device; `launch` runs one fast-form instance into fresh
    poisoned outputs and returns them (device arrays, one per segment)."""

    def __init__(self, ns, k, x=None):
        g = _gpu()
        self.ns, self.k = tuple(ns), k
        self.x = bf16_input((k,)) if x is None else x
        self.weights = [nvfp4_weight(n, k) for n in ns]
        self.dev = [(g.to_gpu(p), g.to_gpu(s)) for p, s, _ in self.weights]
        self.xd = g.to_gpu(bf16_bits(self.x))

    def launch(self, inst, grid, block, pdl=False, sync=True):
        from kbpc.testing.launchers import launcher  # noqa: PLC0415
        g = _gpu()
        ys = [g.poisoned((n,), np.uint16) for n in self.ns]
        if inst.params[0].startswith("kbp::W4A16SegList"):
            table = seg_table([(int(c.gpudata), int(s.gpudata), int(y.gpudata), float(w[2]), n)
                               for (c, s), y, w, n in zip(self.dev, ys, self.weights, self.ns)], W4A16_SEG)
            args = (table, self.xd)
        else:
            (c, s), = self.dev
            args = (c, s, np.float32(self.weights[0][2]), self.xd, ys[0], self.ns[0])
        launcher(inst)((grid, 1, 1), block, *args, pdl=pdl, sync=sync)
        return ys

    def walk(self, w: lw.WalkShape, **kw):
        return self.launch(lw.walk_instance(self.k, w, _nseg(self.ns)), w.grid, w.block, **kw)

    def one_wave(self, ks: int):
        """w4a16_mma with the same KS (T tiles per CTA, one CTA per T tiles)."""
        t = max(1, 8 // ks)
        grid = sum(-(-n // (16 * t)) for n in self.ns)
        return self.launch(lw.mma_instance(self.k, ks, t, _nseg(self.ns)), grid, (32 * ks * t, 1, 1))

    def fetch(self, ys, what):
        g = _gpu()
        return [g.fetch(y, f"{what} segment {i}") for i, y in enumerate(ys)]

    def check(self, got, ks, what):
        for i, (bits, w) in enumerate(zip(got, self.weights)):
            assert_fast_bound(bits, self.x, w, ks, f"{what} segment {i}")


def assert_same_bits(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        bad = np.flatnonzero(a != b)
        assert bad.size == 0, f"{what} segment {i}: {bad.size} of {a.size} outputs differ from w4a16_mma, first {bad[:5]}"


@pytest.mark.parametrize("ns,k", SEED_SHAPES, ids=["kda_six", "kda_o", "kda_q", "shared_gate_up", "shared_down"])
def test_walk_seed_shapes(ns, k):
    """The schedule the lowering picks for sm_90, against the reference and the one-wave form."""
    p = Problem(ns, k)
    w = lw.walk_shape(_tiles(ns), k, SMS)
    _prebuild(p, [w])
    got = p.fetch(p.walk(w, pdl=True), f"walk {w}")
    p.check(got, w.ks, f"walk {ns}x{k} {w}")
    assert_same_bits(got, p.fetch(p.one_wave(w.ks), "w4a16_mma"), f"walk {ns}x{k} {w}")


def _schedules(ns, k):
    """The lowered pick, its 16-warp-CTA form, KS = 1 (16 one-warp slots, a 3-deep ring), KS = 16 (a
    1-deep ring), KS = 4 with the full ring and KS = 2 with eight slots (named barriers 1..8), each
    on its own grid and on grids that make one CTA walk every tile (many tiles per slot: the ring
    crosses tiles, the partials alternate halves), an odd grid, and more CTAs than tiles (idle slots)."""
    tiles, pick = _tiles(ns), lw.walk_shape(_tiles(ns), k, SMS)
    forms = [pick, lw.walk_shape(tiles, k, SMS, cta_warps=16), lw.WalkShape(1, 16, 3, 1), lw.WalkShape(16, 1, 1, 1),
             lw.WalkShape(4, 2, 8, 1), lw.WalkShape(2, 8, 5, 1)]
    out = []
    for w in dict.fromkeys(forms):
        for grid in dict.fromkeys((w.grid, 1, 3, -(-tiles // w.t) + 5)):
            out.append(lw.WalkShape(w.ks, w.t, w.depth, grid))
    return out


def _prebuild(p: Problem, shapes) -> None:
    """Compile every instance a test launches at once (nvcc in parallel)."""
    from kbpc.testing.launchers import prebuild  # noqa: PLC0415
    nseg = _nseg(p.ns)
    prebuild([lw.walk_instance(p.k, w, nseg) for w in shapes]
             + [lw.mma_instance(p.k, w.ks, max(1, 8 // w.ks), nseg) for w in shapes])


# K % 128 in {0, 32, 64, 96}; N not a multiple of 16; one to six segments; K below one chunk.
@pytest.mark.parametrize("ns,k", [((48, 4, 17, 33), 2176), ((37,), 1056), ((129, 3), 4160), ((200,), 96),
                                  ((3,), 32), ((16, 1, 31, 64, 5, 100), 4096)])
def test_walk_schedules(ns, k):
    p = Problem(ns, k)
    shapes = _schedules(ns, k)
    _prebuild(p, shapes)
    wave = {}
    for w in shapes:
        got = p.fetch(p.walk(w), f"walk {w}")
        p.check(got, w.ks, f"walk {ns}x{k} {w}")
        if w.ks not in wave:
            wave[w.ks] = p.fetch(p.one_wave(w.ks), f"w4a16_mma KS{w.ks}")
        assert_same_bits(got, wave[w.ks], f"walk {ns}x{k} {w}")


@pytest.mark.parametrize("scale", [1e-30, 3e4, 1e12, 0.0])
def test_walk_activation_range(scale):
    """The per-CTA power-of-two scaling of x, with one element far below the rest (rounded in FP16:
    the bound's middle term): each CTA of the walk stages x once for all its tiles."""
    from kbpc.reference.formats import to_bf16  # noqa: PLC0415
    k = 1024
    x = bf16_input((k,), scale) if scale else np.zeros(k, np.float32)
    x[7] = to_bf16(np.float32(scale * 1e-12))
    p = Problem((96, 40), k, x)
    w = lw.WalkShape(4, 2, 4, 2)
    got = p.fetch(p.walk(w), f"walk x*{scale}")
    p.check(got, w.ks, f"walk x*{scale}")
    assert_same_bits(got, p.fetch(p.one_wave(4), "w4a16_mma"), f"walk x*{scale}")


@pytest.mark.parametrize("ns,k", [SEED_SHAPES[0], ((48, 4, 17, 33), 2176)], ids=["kda_six", "odd"])
def test_walk_replays_identical(ns, k):
    """Eight launches back to back with PDL and no synchronization between them (each may start
    while the previous one runs) into separate outputs: all bit-identical."""
    p = Problem(ns, k)
    w = lw.walk_shape(_tiles(ns), k, SMS)
    runs = [p.walk(w, pdl=True, sync=False) for _ in range(8)]
    import pycuda.driver as cuda  # noqa: PLC0415
    cuda.Context.synchronize()
    first = p.fetch(runs[0], "replay 0")
    for r, ys in enumerate(runs[1:], 1):
        assert_same_bits(p.fetch(ys, f"replay {r}"), first, f"replay {r} of {ns}x{k}")


@pytest.mark.parametrize("pdl", [False, True])
def test_walk_through_the_lowering(tiny_path, pdl):
    """Every fast w4a16 launch the lowering makes for the tiny example (one linear and segment
    lists), instance, grid and block as lowered, within the bound."""
    from kbpc.testing.lowering import family_groups, planned  # noqa: PLC0415
    plan, ctx = planned(str(tiny_path), numerics="fast")
    launches = [l for grp in family_groups(plan, "w4a16_gemv") for l in lw.lower(ctx, grp)
                if l.instance.header == lw.WALK_HEADER]
    assert launches
    for launch in launches:
        nodes = [plan.blueprint.node_by_id[n] for n in launch.nodes]
        ns, k = [ctx.output(n).dim_value for n in nodes], ctx.input(nodes[0]).dim_value
        ks = int(launch.instance.kernel.split("<")[1].split(",")[1])
        p = Problem(ns, k)
        got = p.fetch(p.launch(launch.instance, launch.grid[0], launch.block, pdl=pdl), launch.instance.kernel)
        p.check(got, ks, f"{launch.nodes} through the launcher")
