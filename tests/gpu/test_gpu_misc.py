"""GPU tests of the MoE glue and embedding kernels against kbpc.reference: glm_router_topk,
glm_swiglu_clamp, glm_moe_combine, embed_copy (glm_mhc: test_gpu_misc_mhc.py). SwiGLU, combine and
embed run through the product's launchers with the lowerings' instances and launch geometry
(kbpc.testing.instances; the FP32 and zero-filling SwiGLU forms are the same template).

Fresh random inputs every run (the seed is in every failure message); outputs are poisoned and
checked fully written. Shapes: the seed's (288 experts, top 8; moe_inter 2048; hidden 4096) and
small odd-but-legal ones (fewer experts than slots, 33 and 700 experts, widths 100 and 37).

Tolerances:
- ids, selection, data movement (embed), combine: exact.
- router and SwiGLU as shipped (the default build: exp in double, rounded once, as the
  reference): exact bits.
- with -DKBP_FAST_MATH (expf, within 2 ulp of the correctly rounded exp): router weights within 2e-6
  relative (the sigmoid's few ulp, then one division and one multiply); ids still exact because
  the random rows are redrawn until the top k+1 choice values are 1e-5 apart (expf's error moves a
  choice value by < 1e-6), and the tie rows use repeated (logit, bias) pairs, which tie exactly in
  any build. SwiGLU FP32 output within 1e-6 relative (expf's 2 ulp through 1 + e, one division,
  one product); BF16 output within 1 BF16 ulp (such a difference can flip one rounding) and at
  least 99% identical.
"""
from __future__ import annotations

import numpy as np
import pytest

from kbpc.codegen.families import embed_copy as lower_embed
from kbpc.codegen.families import glm_moe_combine as lower_combine
from kbpc.codegen.families import glm_swiglu_clamp as lower_swiglu
from kbpc.codegen.families._rows import row_grid
from kbpc.reference import embed_copy as ref_embed
from kbpc.reference import glm_moe_combine as ref_combine
from kbpc.reference import glm_router_topk as ref_router
from kbpc.reference import glm_swiglu_clamp as ref_swiglu
from kbpc.reference.formats import bf16_bits, bf16_from_bits
from kbpc.testing import instances as ki
from kbpc.testing.launchers import launcher

F32 = np.float32
EXACT_FLAGS = ()                      # the default build: correctly rounded exp/rsqrt
FAST_FLAGS = ("-DKBP_FAST_MATH",)      # CUDA expf / rsqrtf (within 2 ulp)
ROUTED_SCALE = 2.5
LIMIT = 10.0
ROUTER_SHAPES = [(288, 8), (5, 8), (33, 4), (700, 8)]
SWIGLU_SHAPES = [(2048, 8), (100, 4), (37, 1)]
COMBINE_SHAPES = [(4096, 8, 8), (100, 3, 4), (36, 5, 2)]
EMBED_SHAPES = [(4096, 8), (100, 4), (7, 1)]


def _gpu():
    from kbpc.testing import gpu  # noqa: PLC0415
    return gpu


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2**63)


# ------------------------------------------------------------------ sources

def router_source(e: int, k: int) -> str:
    return f"""#include "glm_router_topk.cuh"
extern "C" __global__ void __launch_bounds__(kbp::router_threads({e})) router_{e}_{k}(const float* z,
    const float* b, float scale, float* w, int* ids) {{ kbp::router_topk_body<{e}, {k}>(z, b, scale, w, ids); }}
"""


# The SwiGLU kernel's three output forms: (entry, output enumerator, zero-fill, output dtype).
SWIGLU_FORMS = [("bf16", lower_swiglu.OUT_BF16, False, np.uint16), ("f32", "kbp::SwiGluOut::kF32", False, F32),
                ("zero", lower_swiglu.OUT_BF16, True, np.uint16)]


def all_sources() -> str:
    """The router's wrappers (the other kernels launch through the product's launchers, built by
    tests/nvcc/test_gpu_test_instances.py)."""
    return "\n".join(router_source(*s) for s in ROUTER_SHAPES)


def instances():
    """Every kernel instance this module launches through the product's launchers (the router's
    tests load their own wrappers)."""
    out = [ki.swiglu(inter, vec, o, z) for inter, vec in SWIGLU_SHAPES for _, o, z, _ in SWIGLU_FORMS]
    return out + [ki.moe_combine(*s) for s in COMBINE_SHAPES] + [ki.embed(*s) for s in EMBED_SHAPES]


def _module(src: str, name: str, exact: bool = False):
    return _gpu().load_module(src, name, extra_flags=EXACT_FLAGS if exact else FAST_FLAGS)


def _launcher(inst, exact: bool = False):
    return launcher(inst, flags=EXACT_FLAGS if exact else FAST_FLAGS)


# ------------------------------------------------------------------ checks

def bf16_ulp_distance(a_bits, b_bits) -> np.ndarray:
    def ordered(bits):
        b = np.asarray(bits, np.uint16).astype(np.int32)
        return np.where(b & 0x8000, -(b & 0x7FFF), b)
    return np.abs(ordered(a_bits) - ordered(b_bits))


def assert_bits_equal(got, want, what, seed):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype == np.uint16 and want.dtype != np.uint16:
        want = bf16_bits(want)
    elif got.dtype == np.float32:
        got, want = got.view(np.uint32), np.asarray(want, F32).view(np.uint32)
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, f"{what} (seed {seed}): {bad.size} of {got.size} differ, first at {bad[:6]}"


# ------------------------------------------------------------------ router

def router_rows(rng, m, e, k, margin=1e-5):
    """Random logits/bias whose top k+1 choice values are `margin` apart (an expf-proof order)."""
    bias = (rng.standard_normal(e) * 0.1).astype(F32)
    z = np.empty((m, e), F32)
    for t in range(m):
        while True:
            z[t] = (rng.standard_normal(e) * 2.0).astype(F32)
            chi = np.sort((ref_router.router_scores(z[t]) + bias).astype(F32))[::-1][:k + 1]
            if chi.size < 2 or np.min(-np.diff(chi)) > margin:
                break
    return z, bias


def tie_rows(rng, m, e):
    """Logits and bias from a few values whose choice values are >= 0.01 apart: every equal
    choice value is an exact tie from an identical (logit, bias) pair."""
    z = rng.choice(np.array([-2.0, 0.0, 1.0, 3.0], F32), size=(m, e), p=[0.6, 0.3, 0.08, 0.02])
    bias = rng.choice(np.array([0.0, 0.25], F32), size=e, p=[0.7, 0.3])  # several tie groups in the top k
    return z.astype(F32), bias.astype(F32)


def _run_router(mod, e, k, z, bias):
    gpu = _gpu()
    m = z.shape[0]
    w, ids = gpu.poisoned((m, k), F32), gpu.poisoned((m, k), np.int32)
    mod.get_function(f"router_{e}_{k}")(gpu.to_gpu(z).gpudata, gpu.to_gpu(bias).gpudata, F32(ROUTED_SCALE),
                                       w.gpudata, ids.gpudata, block=(32 * -(-e // 32), 1, 1), grid=(m, 1))
    return gpu.fetch(w, "weights"), gpu.fetch(ids, "ids")


def _check_router(got, z, bias, k, exact, seed):
    w_want, ids_want = ref_router.router_topk(z, bias, k, ROUTED_SCALE)
    np.testing.assert_array_equal(got[1], ids_want, err_msg=f"ids (seed {seed})")
    if exact:
        assert_bits_equal(got[0], w_want, "weights", seed)
    else:
        np.testing.assert_allclose(got[0], w_want, rtol=2e-6, atol=0, err_msg=f"weights (seed {seed})")


@pytest.mark.gpu
@pytest.mark.parametrize("exact", [True, False], ids=["cr-math", "expf"])
@pytest.mark.parametrize("e,k", ROUTER_SHAPES)
def test_router_topk(e, k, exact):
    seed = _seed()
    rng = np.random.default_rng(seed)
    mod = _module(router_source(e, k), f"router_{e}_{k}", exact)
    z, bias = router_rows(rng, 5, e, k)
    _check_router(_run_router(mod, e, k, z, bias), z, bias, k, exact, seed)
    z, bias = tie_rows(rng, 5, e)
    _check_router(_run_router(mod, e, k, z, bias), z, bias, k, exact, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("e,k", [(288, 8), (5, 8)])
def test_router_masks_and_unfilled_slots(e, k):
    """-inf bias and NaN logits are never chosen; unfilled slots are -1 / 0 (an all-masked row)."""
    seed = _seed()
    rng = np.random.default_rng(seed)
    mod = _module(router_source(e, k), f"router_{e}_{k}", True)
    z, bias = tie_rows(rng, 3, e)
    bias[rng.choice(e, size=max(1, e // 2), replace=False)] = -np.inf
    z[0, rng.choice(e, size=max(1, e // 3), replace=False)] = np.nan
    z[2, :] = np.nan
    got = _run_router(mod, e, k, z, bias)
    _check_router(got, z, bias, k, True, seed)
    assert (got[1][2] == -1).all() and (got[0][2] == 0).all()


# ------------------------------------------------------------------ swiglu

@pytest.mark.gpu
@pytest.mark.parametrize("exact", [True, False], ids=["cr-math", "expf"])
@pytest.mark.parametrize("inter,vec", SWIGLU_SHAPES)
def test_swiglu_clamp(inter, vec, exact):
    gpu = _gpu()
    seed = _seed()
    rng = np.random.default_rng(seed)
    rows = 8
    gu_bits = bf16_bits((rng.standard_normal((rows, 2 * inter)) * 6.0).astype(F32))  # many clamped
    gu_bits.reshape(-1)[rng.choice(gu_bits.size, 3, replace=False)] = 0x7FC0  # NaN: fminf/fmaxf drop it
    gu = gpu.to_gpu(gu_bits)
    gate, up = int(gu.gpudata), int(gu.gpudata) + 2 * inter
    gu_vals = bf16_from_bits(gu_bits)
    zero = gpu.poisoned((rows * 4096 + 3,), F32)
    grid = row_grid(inter, lower_swiglu.THREADS, vec, rows)
    for entry, form, zero_fill, dtype in SWIGLU_FORMS:
        out = gpu.poisoned((rows, inter), dtype)
        _launcher(ki.swiglu(inter, vec, form, zero_fill), exact)(
            grid, (lower_swiglu.THREADS, 1, 1), np.uintp(gate), np.uintp(up), np.int64(2 * inter), out,
            np.int64(inter), F32(LIMIT), zero if zero_fill else None, np.uint64(zero.size if zero_fill else 0))
        got = gpu.fetch(out, f"swiglu {entry}")
        want = ref_swiglu.swiglu_clamp_rows(gu_vals, LIMIT, out="f32" if entry == "f32" else "bf16")
        if exact:
            assert_bits_equal(got, want, f"swiglu {entry}", seed)
        elif entry == "f32":
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=f"swiglu f32 (seed {seed})")
        else:
            dist = bf16_ulp_distance(got, bf16_bits(want))
            assert dist.max() <= 1 and np.mean(dist == 0) >= 0.99, f"swiglu {entry} (seed {seed})"
    assert (gpu.fetch(zero, "zero-filled buffer") == 0).all()


# ------------------------------------------------------------------ combine

@pytest.mark.gpu
@pytest.mark.parametrize("indexed", [False, True], ids=["slot-order", "expert-sorted"])
@pytest.mark.parametrize("d,k,vec", COMBINE_SHAPES)
def test_moe_combine(d, k, vec, indexed):
    gpu = _gpu()
    seed = _seed()
    rng = np.random.default_rng(seed)
    m = 3
    w = (rng.uniform(0.0, 1.0, (m, k)) * ROUTED_SCALE / k).astype(F32)
    ids = rng.integers(0, 288, (m, k)).astype(np.int32)
    ids[1, k - 1] = -1  # unfilled trailing slots: their rows hold NaN and must be skipped
    ids[2, max(1, k - 2):] = -1
    w[ids < 0] = 0.0
    e_bits = bf16_bits(rng.standard_normal((m, k, d)).astype(F32))
    e_bits[ids < 0] = 0x7FC0
    sh_bits = bf16_bits(rng.standard_normal((m, d)).astype(F32))
    rows = np.arange(m * k, dtype=np.int32)
    buf = e_bits.reshape(m * k, d)
    if indexed:  # expert-sorted rows: slot (t, kappa) lives at row perm[t*k + kappa]
        rows = rng.permutation(m * k).astype(np.int32)
        buf = np.empty_like(buf)
        buf[rows] = e_bits.reshape(m * k, d)
    y = gpu.poisoned((m, d), np.uint16)
    _launcher(ki.moe_combine(d, k, vec))(
        row_grid(d, lower_combine.THREADS, vec, m), (lower_combine.THREADS, 1, 1), gpu.to_gpu(w), gpu.to_gpu(ids),
        gpu.to_gpu(rows) if indexed else None, gpu.to_gpu(buf), gpu.to_gpu(sh_bits), y)
    want = ref_combine.moe_combine(w, bf16_from_bits(e_bits), bf16_from_bits(sh_bits), ids)
    assert_bits_equal(gpu.fetch(y, "combine"), want, "combine", seed)


# ------------------------------------------------------------------ embed

@pytest.mark.gpu
@pytest.mark.parametrize("d,vec", EMBED_SHAPES)
def test_embed_copy(d, vec):
    gpu = _gpu()
    seed = _seed()
    rng = np.random.default_rng(seed)
    vocab = 3001
    table_bits = rng.integers(0, 0xFFFF, (vocab, d), dtype=np.uint16)  # any bits but the poison
    table = gpu.to_gpu(table_bits)
    run, block = _launcher(ki.embed(d, vec)), (lower_embed.THREADS, 1, 1)
    tokens = np.array([0, vocab - 1, *rng.integers(0, vocab, 5)], np.int32)
    out, err = gpu.poisoned((tokens.size, d), np.uint16), gpu.to_gpu(np.zeros(1, np.int32))
    run(row_grid(d, lower_embed.THREADS, vec, tokens.size), block, gpu.to_gpu(tokens), table, np.int32(vocab), out,
        err)
    assert_bits_equal(gpu.fetch(out, "embed"), ref_embed.embed_copy(table_bits, tokens),
                      "embed", seed)
    assert err.get()[0] == 0
    bad = np.array([-1, vocab, 7], np.int32)  # out of range: a zero row and the error flag
    out = gpu.poisoned((3, d), np.uint16)
    run(row_grid(d, lower_embed.THREADS, vec, 3), block, gpu.to_gpu(bad), table, np.int32(vocab), out, err)
    got = gpu.fetch(out, "embed (bad ids)")
    assert (got[:2] == 0).all() and (got[2] == table_bits[7]).all() and err.get()[0] == 1


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("target", ["sm_90", "sm_121"])
def test_misc_sources_compile(tmp_path, target):
    """Every wrapper the GPU tests load (the router's) compiles for both targets (no GPU needed)."""
    from kbpc.toolchain.nvcc import compile_cuda  # noqa: PLC0415
    from kbpc.targets import get_target  # noqa: PLC0415

    src = tmp_path / "misc.cu"
    src.write_text(all_sources())
    compile_cuda(src, tmp_path / "misc.cubin", get_target(target), extra_flags=EXACT_FLAGS)
