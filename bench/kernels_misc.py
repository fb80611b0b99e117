"""Benchmark cases of the hyper-connection, MoE glue and embedding kernels (glm_mhc,
glm_router_topk, glm_swiglu_clamp, glm_moe_combine, embed_copy) at the seed's shapes: 4 streams x
4096, mix rows 24, 288 experts top 8, moe_inter 2048, one token. See bench/kernels.py.

The hyper-connection boundary (post-mix of one site + pre-mix and RMSNorm of the next) has a
budget of 4 us; it is timed as the two kernels back to back, as the 24-CTA FUSE_POST form, as the
last-CTA one-launch form it had (glm_mhc_boundary_lastcta.cuh, "hc_boundary_lastcta"), and as the
hc_boundary (glm_mhc_boundary.cuh) the lowering uses now (producers + two tail CTAs, hand-off
slots), at several CTA shapes, with the gates + Sinkhorn left to a side stream, and with the MoE
combine in front (the blend kernel + boundary as two launches beside the fused form). Plain
launches expose the Phi load that PDL hides in the step, so the seed-shape forms are also timed
through the product launcher with PDL, back to back (each launch's Phi load overlapping the previous
launch, as in the step): "PDL" in the name. The head + final norm likewise.

The MoE router (fusion rule router_gemv_topk) is timed as the fused router_gemv_topk and as the two
launches it replaces (the dense_bf16 GEMV, then router_topk), both through the product's launchers
with PDL, at the seed's 288 experts and its 128-expert shrink."""
from __future__ import annotations

import numpy as np

from kernels import Case, rotations

N, D, EXPERTS, TOPK, INTER = 4, 4096, 288, 8, 2048
ROWS = (2 + N) * N
PRE_THREADS = 288
POST_THREADS, POST_VEC = 32, 4

_PRE_TAIL = ("const __nv_bfloat16* phi, const float* alpha, const float* beta, const __nv_bfloat16* gamma, "
             "float eps_n, float eps_hc, float eps, int iters, float* mix, unsigned int* counters, "
             "__nv_bfloat16* collapsed, __nv_bfloat16* normed, float* post, float* comb")
_PRE_FIELDS = "phi, alpha, beta, gamma, eps_n, eps_hc, eps, iters, mix, counters, collapsed, normed, post, comb"

BOUNDARY_RPC = (2, 3, 4, 5)  # chains (warps) per CTA of the fused boundary: 104, 72, 56, 40 producers
SLOTS = ROWS + 2             # kbp::mhc::boundary_slots(N): hand-off slot rows of the new boundary
HEAD_THREADS = min(1024, D // 2)  # kbpc.reference.rms_norm.block_threads(D)


def _boundary_wrappers() -> str:
    """b_old<src>_<rpc>: the last-CTA boundary (glm_mhc_boundary_lastcta.cuh); b_bd<src>_<rpc>: the
    boundary the lowering uses; b_bdc_<rpc>: the same with the MoE combine in front (top TOPK);
    b_hn<post>: head + final norm."""
    out = []
    for name, body, rpcs in (("old", "hc_boundary_lastcta_body<{N}, {D}, 1, 1, {rpc}>", (4,)),
                             ("bd", "hc_boundary_body<{N}, {D}, {src}, 1, 0, {rpc}>", None)):
        for src, src_rpcs in ((0, (4,)), (1, rpcs or BOUNDARY_RPC), (2, (4,))):
            if name == "old" and src != 1:
                continue
            for rpc in src_rpcs:
                call = body.format(N=N, D=D, src=src, rpc=rpc)
                out.append(f"""extern "C" __global__ void __launch_bounds__({PRE_THREADS}, 1) b_{name}{src}_{rpc}(
    const float* x, const __nv_bfloat16* h, const __nv_bfloat16* u, const float* post_in, const float* comb_in,
    float* x_out, {_PRE_TAIL}, unsigned int* work) {{
  const PreParams<{N}, 1> p{{x, {{{{u}}}}, post_in, comb_in, x_out, {_PRE_FIELDS}, h, work}};
  {call}(p); }}""")
    for rpc in (4,):
        out.append(f"""extern "C" __global__ void __launch_bounds__({PRE_THREADS}, 1) b_bdc_{rpc}(
    const float* x, const float* w, const __nv_bfloat16* e, const __nv_bfloat16* sh, const float* post_in,
    const float* comb_in, float* x_out, {_PRE_TAIL}, unsigned int* work) {{
  const PreParams<{N}, 1, {TOPK}> p{{x, {{w, nullptr, nullptr, e, sh}}, post_in, comb_in, x_out, {_PRE_FIELDS},
                                 nullptr, work}};
  hc_boundary_body<{N}, {D}, 1, 1, {TOPK}, {rpc}>(p); }}""")
    for post in (0, 1):
        out.append(f"""extern "C" __global__ void __launch_bounds__({HEAD_THREADS}) b_hn{post}(const float* x,
    const __nv_bfloat16* u, const float* post_in, const float* comb_in, const __nv_bfloat16* gamma,
    __nv_bfloat16* normed) {{
  const HeadParams<{N}, 1> p{{x, {{{{u}}}}, post_in, comb_in, nullptr, gamma, 1e-5f, nullptr, normed}};
  hc_head_norm_body<{N}, {D}, {HEAD_THREADS}, true, {bool(post)}, 1>(p); }}""".replace("True", "true")
                   .replace("False", "false"))
    return "\n".join(out)


SOURCE = f"""
#include "glm_mhc.cuh"
#include "glm_mhc_boundary.cuh"
#include "glm_mhc_boundary_lastcta.cuh"
#include "glm_router_topk.cuh"
#include "glm_swiglu_clamp.cuh"
#include "glm_moe_combine.cuh"
#include "embed_copy.cuh"
using namespace kbp;
using namespace kbp::mhc;
extern "C" __global__ void __launch_bounds__({PRE_THREADS}, 1) b_pre(const float* x, {_PRE_TAIL}) {{
  const PreParams<{N}, 1> p{{x, {{{{nullptr}}}}, nullptr, nullptr, nullptr, {_PRE_FIELDS}}};
  hc_pre_norm_body<{N}, {D}, false, 1>(p); }}
extern "C" __global__ void __launch_bounds__({PRE_THREADS}, 1) b_post_pre(const float* x, const __nv_bfloat16* u,
    const float* post_in, const float* comb_in, float* x_out, {_PRE_TAIL}) {{
  const PreParams<{N}, 1> p{{x, {{{{u}}}}, post_in, comb_in, x_out, {_PRE_FIELDS}}};
  hc_pre_norm_body<{N}, {D}, true, 1>(p); }}
{_boundary_wrappers()}
extern "C" __global__ void b_post(const float* x, const __nv_bfloat16* u, const float* post, const float* comb,
    float* y) {{ hc_post_body<{N}, {D}, 1, {POST_VEC}>(x, RankParts<1>{{{{u}}}}, post, comb, y); }}
extern "C" __global__ void __launch_bounds__(32) b_gates(const float* mix, const float* alpha, const float* beta,
    float eps_hc, int iters, float* post, float* comb) {{ hc_gates_body<{N}>(mix, alpha, beta, eps_hc, iters, post, comb); }}
extern "C" __global__ void b_expand(const __nv_bfloat16* h, float* x) {{ hc_expand_body<{N}, {D}, 4>(h, x); }}
extern "C" __global__ void b_head(const float* x, __nv_bfloat16* y) {{ hc_head_body<{N}, {D}, 4>(x, y); }}
extern "C" __global__ void __launch_bounds__(router_threads({EXPERTS})) b_router(const float* z, const float* b,
    float s, float* w, int* ids) {{ router_topk_body<{EXPERTS}, {TOPK}>(z, b, s, w, ids); }}
extern "C" __global__ void b_swiglu(const __nv_bfloat16* g, const __nv_bfloat16* u, long s, void* y, long ys,
    float lim, float* z, size_t zn) {{ swiglu_clamp_body<{INTER}, 8, SwiGluOut::kBF16, true>(g, u, s, y, ys, lim, z, zn); }}
extern "C" __global__ void b_combine(const float* w, const int* ids, const __nv_bfloat16* e,
    const __nv_bfloat16* sh, __nv_bfloat16* y) {{ moe_combine_body<{D}, {TOPK}, 8>(w, ids, nullptr, e, sh, y); }}
extern "C" __global__ void b_embed(const int* tok, const uint16_t* table, int vocab, uint16_t* out) {{
  embed_copy_body<{D}, 8>(tok, table, vocab, out, nullptr); }}
"""

F32 = np.float32


def _mod():
    from kbpc.testing.gpu import load_module  # noqa: PLC0415
    return load_module(SOURCE, "bench_misc")


def _gpu(a):
    from kbpc.testing.gpu import to_gpu  # noqa: PLC0415
    return to_gpu(np.ascontiguousarray(a))


def _bf16(rng, shape, scale=1.0):
    from kbpc.reference.formats import bf16_bits  # noqa: PLC0415
    return bf16_bits((rng.standard_normal(shape) * scale).astype(F32))


class _PreState:
    """Rotating Phi / stream sets plus the small per-site tensors of one pre-mix launch."""

    def __init__(self, fused: bool):
        rng = np.random.default_rng(0)
        self.n = rotations(ROWS * N * D * 2 + N * D * 4 * (2 if fused else 1))
        self.phis = [_gpu(_bf16(rng, (ROWS, N * D), 0.01)) for _ in range(self.n)]
        self.xs = [_gpu(rng.standard_normal((N, D)).astype(F32)) for _ in range(self.n)]
        self.x_out = [_gpu(np.zeros((N, D), F32)) for _ in range(self.n)] if fused else None
        self.u = _gpu(_bf16(rng, D))
        self.post_in = _gpu(np.full(N, 1.0, F32))
        self.comb_in = _gpu(np.full((N, N), 1.0 / N, F32))
        self.small = [_gpu(np.ones(3, F32)), _gpu(np.zeros(ROWS, F32)), _gpu(_bf16(rng, D))]
        self.mix, self.counters = _gpu(np.zeros(ROWS, F32)), _gpu(np.zeros(1, np.uint32))
        self.work = _gpu(np.zeros(SLOTS * 128, np.uint32))  # the boundary's hand-off slots (zero)
        self.w = _gpu(np.full(TOPK, 2.5 / TOPK, F32))       # a MoE combine in front: router weights,
        self.experts = _gpu(_bf16(rng, (TOPK, D)))          # the routed rows, the shared row
        self.shared = _gpu(_bf16(rng, D))
        self.hs = [_gpu(_bf16(rng, D)) for _ in range(self.n)]
        self.normed, self.post = _gpu(np.zeros(D, np.uint16)), _gpu(np.zeros(N, F32))
        self.comb = _gpu(np.zeros((N, N), F32))

    def tail(self, i):
        return [self.phis[i % self.n], *self.small, F32(1e-6), F32(1e-6), F32(1e-5), np.int32(20), self.mix,
                self.counters, np.uintp(0), self.normed, self.post, self.comb]


_PRE_BYTES = ROWS * N * D * 2 + N * D * 4 + D * 2 + D * 2 + (N + N * N + ROWS) * 4
_POST_BYTES = N * D * 4 * 2 + D * 2 + (N + N * N) * 4


def _pre_case() -> Case:
    def setup():
        f, st = _mod().get_function("b_pre"), _PreState(False)
        return lambda i: f(st.xs[i % st.n], *st.tail(i), block=(PRE_THREADS, 1, 1), grid=(ROWS, 1))
    return Case("glm_mhc::hc_pre_norm", f"{N}x{D} f32, Phi {ROWS}x{N * D} bf16", _PRE_BYTES, setup)


def _pre_side_gates_cases() -> list[Case]:
    def pre():
        f, st = _mod().get_function("b_pre"), _PreState(False)

        def launch(i):
            tail = st.tail(i)
            tail[-1] = np.uintp(0)  # comb = nullptr: no gates in the tail
            f(st.xs[i % st.n], *tail, block=(PRE_THREADS, 1, 1), grid=(ROWS, 1))
        return launch

    def gates():
        f, st = _mod().get_function("b_gates"), _PreState(False)
        return lambda i: f(st.mix, st.small[0], st.small[1], F32(1e-6), np.int32(20), st.post, st.comb,
                           block=(32, 1, 1), grid=(1, 1))
    return [Case("glm_mhc::hc_pre_norm, gates on a side stream", "critical path", _PRE_BYTES, pre),
            Case("glm_mhc::hc_gates (side stream)", "Sinkhorn T=20", (ROWS + N + N * N) * 4, gates)]


def _post_launch(f, st, i):
    f(st.xs[i % st.n], st.u, st.post_in, st.comb_in, st.xs[i % st.n], block=(POST_THREADS, 1, 1),
      grid=(D // (POST_THREADS * POST_VEC), 1))


def _post_case() -> Case:
    def setup():
        f, st = _mod().get_function("b_post"), _PreState(False)
        return lambda i: _post_launch(f, st, i)
    return Case("glm_mhc::hc_post", f"{N}x{D} f32 + {D} bf16, in place", _POST_BYTES, setup)


def _boundary_case() -> Case:
    def setup():
        mod, st = _mod(), _PreState(False)
        post, pre = mod.get_function("b_post"), mod.get_function("b_pre")

        def launch(i):
            _post_launch(post, st, i)
            pre(st.xs[i % st.n], *st.tail(i), block=(PRE_THREADS, 1, 1), grid=(ROWS, 1))
        return launch
    return Case("glm_mhc::boundary post + pre_norm (2 launches)", "budget 4 us",
                _PRE_BYTES + _POST_BYTES, setup)


def _fused_boundary_case() -> Case:
    def setup():
        f, st = _mod().get_function("b_post_pre"), _PreState(True)
        return lambda i: f(st.xs[i % st.n], st.u, st.post_in, st.comb_in, st.x_out[i % st.n], *st.tail(i),
                           block=(PRE_THREADS, 1, 1), grid=(ROWS, 1))
    return Case("glm_mhc::boundary post+pre_norm fused", "budget 4 us", _PRE_BYTES + N * D * 4 + D * 2,
                setup)


def _boundary_ctas(rpc: int, tails: int = 2) -> int:
    """Producers (8 column groups x the chains in groups of rpc), then the tails (0: the last-CTA form)."""
    return 8 * -(-(ROWS + 1) // rpc) + tails


def _boundary_launch(f, st, i, src: int, side_gates: bool = False, tails: int = 2):
    tail = st.tail(i)
    if side_gates:
        tail[-1] = np.uintp(0)  # comb = nullptr: hc_gates on a side stream
    x_out = st.x_out[i % st.n] if src else np.uintp(0)
    f(st.xs[i % st.n], st.hs[i % st.n], st.u, st.post_in, st.comb_in, x_out, *tail, st.work,
      block=(PRE_THREADS, 1, 1), grid=(_boundary_ctas(st.rpc, tails), 1))


def _combine_boundary_launch(f, st, i):
    f(st.xs[i % st.n], st.w, st.experts, st.shared, st.post_in, st.comb_in, st.x_out[i % st.n], *st.tail(i),
      st.work, block=(PRE_THREADS, 1, 1), grid=(_boundary_ctas(st.rpc), 1))


_FUSED = _PRE_BYTES + N * D * 4 + D * 2
_COMBINE = TOPK * D * 2 + D * 2 + TOPK * 4  # what the combine reads instead of u (D * 2)


def _fused_boundary_cases() -> list[Case]:
    """kernels/glm_mhc_boundary.cuh: one launch per boundary, at several CTA shapes; the last-CTA form
    it replaced; the MoE combine in front (fused, and as the blend kernel + boundary)."""
    def make(name: str, src: int, rpc: int, side_gates: bool = False):
        def setup():
            f, st = _mod().get_function(f"b_{name}{src}_{rpc}"), _PreState(src != 0)
            st.rpc = rpc
            return lambda i: _boundary_launch(f, st, i, src, side_gates, 0 if name == "old" else 2)
        return setup

    def combined(two_launches: bool):
        def setup():
            mod, st = _mod(), _PreState(True)
            st.rpc = 4
            if not two_launches:
                f = mod.get_function("b_bdc_4")
                return lambda i: _combine_boundary_launch(f, st, i)
            blend, f = mod.get_function("b_combine"), mod.get_function("b_bd1_4")

            def launch(i):
                blend(st.w, np.uintp(0), st.experts, st.shared, st.u, block=(64, 1, 1), grid=(D // (64 * 8), 1))
                _boundary_launch(f, st, i, 1)
            return launch
        return setup
    cases = [Case(f"glm_mhc::hc_boundary_lastcta post+pre_norm {_boundary_ctas(4, 0)} CTAs", "before; budget 4 us",
                  _FUSED, make("old", 1, 4))]
    cases += [Case(f"glm_mhc::hc_boundary post+pre_norm {_boundary_ctas(r)} CTAs", "budget 4 us", _FUSED,
                   make("bd", 1, r)) for r in BOUNDARY_RPC]
    return cases + [
        Case("glm_mhc::hc_boundary post+pre_norm, side gates", "58 CTAs, + hc_gates", _FUSED, make("bd", 1, 4, True)),
        Case("glm_mhc::hc_boundary expand+pre_norm", "58 CTAs", _PRE_BYTES + N * D * 4, make("bd", 2, 4)),
        Case("glm_mhc::hc_boundary pre_norm", "58 CTAs", _PRE_BYTES, make("bd", 0, 4)),
        Case("glm_mhc::hc_boundary combine+post+pre_norm", f"58 CTAs, top {TOPK}", _FUSED - D * 2 + _COMBINE,
             combined(False)),
        Case("glm_moe_combine + glm_mhc::hc_boundary (2 launches)", f"top {TOPK}", _FUSED + _COMBINE + D * 2,
             combined(True))]


def _pdl_boundary_cases() -> list[Case]:
    """The seed-shape boundaries through the product launcher (kbpc.testing.launchers) with PDL, back
    to back: each launch's Phi load overlaps the previous launch, as in the step; the last-CTA form
    and the cluster form (BOUNDARY_CLUSTER, off in the product) beside the current one, without and
    with the combine in front."""
    def make(form: str):
        def setup():
            from kbpc.codegen.families import glm_mhc as lower  # noqa: PLC0415
            from kbpc.codegen.families.glm_moe_combine import PARAMS as BLEND_PARAMS  # noqa: PLC0415
            from kbpc.codegen.records import KernelInstance  # noqa: PLC0415
            from kbpc.testing.launchers import launcher  # noqa: PLC0415
            from kbpc.testing.structs import pack_struct  # noqa: PLC0415
            st = _PreState(True)
            k = TOPK if form in ("combine", "cluster combine") else 0
            cluster = lower.CLUSTER_WIDTH if form.startswith("cluster") else 0
            block = lower.boundary_block(N, cluster)
            if form == "old":
                inst = KernelInstance("glm_mhc", "glm_mhc_boundary_lastcta.cuh",
                                      f"kbp::mhc::hc_boundary_lastcta<{N}, {D}, 1, 1, 4>",
                                      (f"kbp::mhc::PreParams<{N}, 1, 0>",))
                grid = (_boundary_ctas(4, 0), 1, 1)
            else:
                inst = lower.boundary_instance(N, D, 1, 1, 4, slots=k, cluster=cluster)
                grid = lower.boundary_grid(N, 1, 4, cluster)
            run = launcher(inst)
            branch = ([("ptr", st.w), ("ptr", None), ("ptr", None), ("ptr", st.experts), ("ptr", st.shared)] if k
                      else [("ptr", st.u)])
            params = [pack_struct([("ptr", st.xs[j]), *branch, ("ptr", st.post_in), ("ptr", st.comb_in),
                                   ("ptr", st.x_out[j]), ("ptr", st.phis[j]), ("ptr", st.small[0]),
                                   ("ptr", st.small[1]), ("ptr", st.small[2]), ("f32", 1e-6), ("f32", 1e-6),
                                   ("f32", 1e-5), ("i32", 20), ("ptr", st.mix), ("ptr", st.counters), ("ptr", None),
                                   ("ptr", st.normed), ("ptr", st.post), ("ptr", st.comb), ("ptr", None),
                                   ("ptr", st.work)]) for j in range(st.n)]
            blend = launcher(KernelInstance("glm_moe_combine", "glm_moe_combine.cuh",
                                            f"kbp::moe_combine<{D}, {TOPK}, 8>", BLEND_PARAMS))

            def launch(i):
                if form == "two":
                    blend((D // (64 * 8), 1, 1), (64, 1, 1), st.w, None, None, st.experts, st.shared, st.u,
                          pdl=True, sync=False)
                run(grid, block, params[i % st.n], pdl=True, sync=False)
            return launch
        return setup
    return [Case("glm_mhc::hc_boundary_lastcta post+pre_norm, PDL", "before; 56 CTAs", _FUSED, make("old")),
            Case("glm_mhc::hc_boundary post+pre_norm, PDL", "58 CTAs", _FUSED, make("new")),
            Case("glm_mhc::hc_boundary combine+post+pre_norm, PDL", f"top {TOPK}", _FUSED - D * 2 + _COMBINE,
                 make("combine")),
            Case("glm_mhc::hc_boundary_cluster post+pre_norm, PDL", "one 16-CTA cluster (off in the product)",
                 _FUSED, make("cluster")),
            Case("glm_mhc::hc_boundary_cluster combine+post+pre_norm, PDL", f"16 CTAs, top {TOPK}",
                 _FUSED - D * 2 + _COMBINE, make("cluster combine")),
            Case("glm_moe_combine + glm_mhc::hc_boundary, PDL", f"2 launches, top {TOPK}", _FUSED + _COMBINE + D * 2,
                 make("two"))]


def _head_norm_cases() -> list[Case]:
    def make(post: int):
        def setup():
            f, st = _mod().get_function(f"b_hn{post}"), _PreState(False)
            return lambda i: f(st.xs[i % st.n], st.u, st.post_in, st.comb_in, st.small[2], st.normed,
                               block=(HEAD_THREADS, 1, 1), grid=(1, 1))
        return setup
    nbytes = N * D * 4 + 3 * D * 2
    return [Case("glm_mhc::hc_head_norm head+final norm", f"{N}x{D} f32 -> {D} bf16", nbytes, make(0)),
            Case("glm_mhc::hc_head_norm post+head+final norm", "1 CTA", nbytes + D * 2, make(1))]


def _expand_head_cases() -> list[Case]:
    def expand():
        f, rng = _mod().get_function("b_expand"), np.random.default_rng(0)
        n = rotations(D * 2 + N * D * 4)
        hs = [_gpu(_bf16(rng, D)) for _ in range(n)]
        xs = [_gpu(np.zeros((N, D), F32)) for _ in range(n)]
        return lambda i: f(hs[i % n], xs[i % n], block=(32, 1, 1), grid=(D // 128, 1))

    def head():
        f, rng = _mod().get_function("b_head"), np.random.default_rng(0)
        n = rotations(D * 2 + N * D * 4)
        xs = [_gpu(rng.standard_normal((N, D)).astype(F32)) for _ in range(n)]
        y = _gpu(np.zeros(D, np.uint16))
        return lambda i: f(xs[i % n], y, block=(32, 1, 1), grid=(D // 128, 1))
    nbytes = D * 2 + N * D * 4
    return [Case("glm_mhc::hc_expand", f"{D} bf16 -> {N}x{D} f32", nbytes, expand),
            Case("glm_mhc::hc_head", f"{N}x{D} f32 -> {D} bf16", nbytes, head)]


def _router_case() -> Case:
    nbytes = EXPERTS * 8 + TOPK * 8

    def setup():
        f, rng = _mod().get_function("b_router"), np.random.default_rng(0)
        n = rotations(nbytes)
        zs = [_gpu(rng.standard_normal(EXPERTS).astype(F32)) for _ in range(n)]
        b = _gpu((rng.standard_normal(EXPERTS) * 0.1).astype(F32))
        w, ids = _gpu(np.zeros(TOPK, F32)), _gpu(np.zeros(TOPK, np.int32))
        return lambda i: f(zs[i % n], b, F32(2.5), w, ids, block=(32 * -(-EXPERTS // 32), 1, 1), grid=(1, 1))
    return Case("glm_router_topk::router_topk", f"1x{EXPERTS} f32, top {TOPK}", nbytes, setup)


def _router_gemv_cases() -> list[Case]:
    """router_gemv_topk (one launch) vs dense_gemv_bf16 + router_topk (two), PDL on both; the router
    weights rotate over sets (2.4 MB at 288 experts), the counter and outputs are shared."""
    def make(experts: int, fused: bool):
        def setup():
            from kbpc.codegen.families import dense_bf16 as dense  # noqa: PLC0415
            from kbpc.codegen.families import glm_router_topk as router  # noqa: PLC0415
            from kbpc.codegen.records import KernelInstance  # noqa: PLC0415
            from kbpc.testing.launchers import launcher  # noqa: PLC0415
            rng = np.random.default_rng(0)
            ws = [_gpu(_bf16(rng, (experts, D), 0.05)) for _ in range(rotations(experts * D * 2))]
            x, b = _gpu(_bf16(rng, D)), _gpu((rng.standard_normal(experts) * 0.1).astype(F32))
            z, w, ids = _gpu(np.zeros(experts, F32)), _gpu(np.zeros(TOPK, F32)), _gpu(np.zeros(TOPK, np.int32))
            if fused:
                run, opc = launcher(router.fused_instance(D, experts, TOPK)), router.fused_outputs_per_cta(experts)
                arrive = _gpu(np.zeros(1, np.uint32))
                return lambda i: run((-(-experts // opc), 1, 1), (64 * opc, 1, 1), ws[i % len(ws)], x, b, F32(2.5),
                                     z, arrive, w, ids, pdl=True, sync=False)
            opc = dense.outputs_per_cta(experts)
            kernel = f"kbp::dense_gemv_bf16<{D}, float>" if opc == 4 else f"kbp::dense_gemv_bf16_opc<{D}, float, {opc}>"
            gemv = launcher(KernelInstance("dense_bf16", "dense_bf16.cuh", kernel,
                                           ("const __nv_bfloat16*", "const __nv_bfloat16*", "float*", "int")))
            topk = launcher(KernelInstance("glm_router_topk", "glm_router_topk.cuh",
                                           f"kbp::router_topk<{experts}, {TOPK}>",
                                           ("const float*", "const float*", "float", "float*", "int*")))

            def launch(i):
                gemv((-(-experts // opc), 1, 1), (64 * opc, 1, 1), ws[i % len(ws)], x, z, experts, pdl=True, sync=False)
                topk((1, 1, 1), (router.router_threads(experts), 1, 1), z, b, F32(2.5), w, ids, pdl=True, sync=False)
            return launch
        return setup
    out = []
    for experts in (EXPERTS, 128):
        nbytes = experts * D * 2 + D * 2 + experts * 4 + TOPK * 8
        out += [Case("glm_router_topk::router_gemv_topk fused", f"{D}x{experts} bf16, top {TOPK}, pdl", nbytes,
                     make(experts, True)),
                Case("dense_bf16 gemv + router_topk (2 launches)", f"{D}x{experts} bf16, top {TOPK}, pdl", nbytes,
                     make(experts, False))]
    return out


def _swiglu_case() -> Case:
    rows, zero_words = TOPK, D  # the routed down projection's FP32 accumulator of one token
    nbytes = rows * INTER * 2 * 2 + rows * INTER * 2 + zero_words * 4

    def setup():
        f, rng = _mod().get_function("b_swiglu"), np.random.default_rng(0)
        n = rotations(nbytes)
        gus = [_gpu(_bf16(rng, (rows, 2 * INTER), 4.0)) for _ in range(n)]
        y, z = _gpu(np.zeros((rows, INTER), np.uint16)), _gpu(np.zeros(zero_words, F32))

        def launch(i):
            g = int(gus[i % n].gpudata)
            f(np.uintp(g), np.uintp(g + 2 * INTER), np.int64(2 * INTER), y, np.int64(INTER), F32(10.0), z,
              np.uint64(zero_words), block=(128, 1, 1), grid=(INTER // (128 * 8), rows))
        return launch
    return Case("glm_swiglu_clamp::swiglu_clamp bf16+zero", f"{rows}x{INTER} gate|up bf16", nbytes, setup)


def _combine_case() -> Case:
    nbytes = TOPK * D * 2 + D * 2 + D * 2 + TOPK * 8

    def setup():
        f, rng = _mod().get_function("b_combine"), np.random.default_rng(0)
        n = rotations(nbytes)
        es = [_gpu(_bf16(rng, (TOPK, D))) for _ in range(n)]
        sh = [_gpu(_bf16(rng, D)) for _ in range(n)]
        w = _gpu(np.full(TOPK, 0.3, F32))
        ids = _gpu(np.arange(TOPK, dtype=np.int32))
        y = _gpu(np.zeros(D, np.uint16))
        return lambda i: f(w, ids, es[i % n], sh[i % n], y, block=(64, 1, 1), grid=(D // (64 * 8), 1))
    return Case("glm_moe_combine::moe_combine", f"{TOPK}x{D} + {D} bf16", nbytes, setup)


def _embed_case() -> Case:
    vocab = 16384  # a 128 MB table: every launch reads a row that is not in L2

    def setup():
        f, rng = _mod().get_function("b_embed"), np.random.default_rng(0)
        table = _gpu(rng.integers(0, 1 << 15, (vocab, D), dtype=np.uint16))
        toks = [_gpu(np.array([t], np.int32)) for t in rng.integers(0, vocab, 64)]
        out = _gpu(np.zeros(D, np.uint16))
        return lambda i: f(toks[i % 64], table, np.int32(vocab), out, block=(64, 1, 1), grid=(D // (64 * 8), 1))
    return Case("embed_copy::embed_copy", f"row of {vocab}x{D} bf16", D * 2 * 2 + 4, setup)


CASES = [_pre_case(), *_pre_side_gates_cases(), _post_case(), _boundary_case(), _fused_boundary_case(),
         *_fused_boundary_cases(), *_pdl_boundary_cases(), *_expand_head_cases(), *_head_norm_cases(),
         _router_case(), *_router_gemv_cases(), _swiglu_case(), _combine_case(), _embed_case()]
