"""glm_mhc: GLM-5 manifold-constrained hyper-connections (expand, mix, pre-mix, norm, post, head).

Math (explain.families.glm_mhc), streams x_1..x_n in R^d (n = n_hc), all FP32:

    r     = (1/(n d) sum_{i,k} x_{i,k}^2 + eps_n)^{-1/2}
    mu_m  = r <Phi_m, [x_1; ...; x_n]>,            m = 1..(2+n)n
    pre_i = sigma(a0 mu_i + beta_i) + eps_hc,     post_i = 2 sigma(a1 mu_{n+i} + beta_{n+i})
    C0_ij = softmax_j(a2 mu_{2n+(i-1)n+j} + beta_{2n+(i-1)n+j}) + eps_hc
    Col(C)_ij = C_ij / (eps_hc + sum_i' C_i'j),   Row(C)_ij = C_ij / (eps_hc + sum_j' C_ij')
    C     = (Col o Row)^{T-1}(Col(C0))            (T column passes, T-1 row passes)
    y     = rn_bf16(sum_i pre_i x_i),
    yhat_k = rn_bf16(y_k (1/d sum_k' y_k'^2 + eps)^{-1/2} gamma_k)
    u     = rn_bf16(sum_rho u^(rho)),             x'_j = post_j u + sum_i C_ij x_i
    expand: x_i = h;   head: y = rn_bf16((sum_i x_i) * (1/n))

Orders chosen (the numerics fix "every dot product is a thread-strided FP32 sum followed by a fixed
256-wide tree"); this module uses that one reduction, `f32ops.strided_tree_sum(.., threads=256)`,
for EVERY sum of the family: the stream sum of squares, the 24 mix dot products, the softmax
denominators, the Sinkhorn row/column sums, the collapse over streams, the site norm's sum of
squares, the post-mix sum over streams and the head sum. A sum over fewer than 256 terms is thus
the halving tree over the terms zero-padded to 256 (e.g. n=4: (a0+a2)+(a1+a3)). The one exception
is the tensor-parallel rank sum, which the numerics fix as a sequential FP32 sum in rank order.
Products are rounded before their add (no FMA). Further choices:

- the flattened stream vector is stream-major [x_1; ...; x_n] (stream i, element k at i*d + k);
- means are true divisions: sum / (n d) and sum / d; rsqrtf is the correctly rounded rsqrt;
- mu_m = r * dot_m (the dot product first, then one multiply by r);
- gate arguments are fl(fl(a * mu) + beta); sigma(z) = 1 / (1 + expf(-z)); post = 2 * sigma;
- softmax subtracts the row max: e_j = expf(z_j - max_j z), C0_ij = fl(e_j / sum_j e) + eps_hc;
- the collapse is tree_i fl(pre_i * x_{i,k}); the site norm is fl(fl(y_k * r) * gamma_k);
- post-mix: fl(post_j * u_k) + tree_i fl(C_ij * x_{i,k}) (the stream sum first, then one add);
- head: tree_i x_{i,k} times fl32(1/n).

Shapes: streams are (..., n, d) float32 (leading axes are tokens); Phi is ((2+n)n, n d) holding
BF16 (or FP32) values, widened exactly; alpha (3,), beta ((2+n)n,), gamma (d,).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kbpc.reference.f32ops import exp_f32, rsqrt_f32, sigmoid_f32, strided_tree_sum
from kbpc.reference.formats import to_bf16
from kbpc.reference.fp32 import seq_sum
from kbpc.reference.rms_norm import rms_norm

F32 = np.float32
THREADS = 256


class PreMix(NamedTuple):
    """Outputs of the pre-mix: the collapsed and normed BF16 rows, post gates and comb matrix."""

    collapsed: np.ndarray  # (..., d) BF16 values
    normed: np.ndarray  # (..., d) BF16 values
    post: np.ndarray  # (..., n) FP32
    comb: np.ndarray  # (..., n, n) FP32, comb[i, j] = C_ij


def _rsum(x, axis: int = -1) -> np.ndarray:
    """The family's one reduction: 256 strided threads then a 256-wide halving tree."""
    return strided_tree_sum(x, axis=axis, threads=THREADS)


def hc_expand(h, n_hc: int) -> np.ndarray:
    """Expand: every stream starts as the BF16 embedding row, (..., d) -> (..., n, d) FP32."""
    h = np.asarray(h, F32)
    return np.repeat(h[..., None, :], n_hc, axis=-2).astype(F32)


def hc_mix(x, phi, eps_n: float) -> np.ndarray:
    """mu = r <Phi_m, x_flat> for every mix row m: (..., n, d) -> (..., (2+n)n) FP32."""
    x = np.asarray(x, F32)
    flat = x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))
    mean = (_rsum(flat * flat) / F32(flat.shape[-1])).astype(F32)
    r = rsqrt_f32(mean + F32(eps_n))
    phi = np.asarray(phi, F32)
    dots = _rsum((flat[..., None, :] * phi).astype(F32))  # (..., M)
    return (dots * r[..., None]).astype(F32)


def _softmax_rows(z: np.ndarray) -> np.ndarray:
    e = exp_f32((z - z.max(axis=-1, keepdims=True)).astype(F32))
    return (e / _rsum(e)[..., None]).astype(F32)


def sinkhorn(c0, eps_hc: float, iters: int) -> np.ndarray:
    """C = (Col o Row)^{iters-1}(Col(c0)), true divisions by (sum + eps_hc)."""
    if iters < 1:
        raise ValueError(f"Sinkhorn needs at least one iteration, got {iters}")
    eps = F32(eps_hc)
    c = np.asarray(c0, F32)
    for it in range(iters):
        if it:
            c = (c / (eps + _rsum(c, axis=-1))[..., :, None]).astype(F32)  # row pass
        c = (c / (eps + _rsum(c, axis=-2))[..., None, :]).astype(F32)  # column pass
    return c


def hc_gates(mu, alpha, beta, n_hc: int, eps_hc: float, iters: int):
    """(pre (..., n), post (..., n), comb (..., n, n)) from the mix outputs mu."""
    mu = np.asarray(mu, F32)
    alpha = np.asarray(alpha, F32)
    beta = np.asarray(beta, F32)
    n = n_hc
    if mu.shape[-1] != (2 + n) * n:
        raise ValueError(f"mix width {mu.shape[-1]} is not (2+n_hc)*n_hc for n_hc={n}")
    z = ((alpha[np.repeat([0, 1, 2], [n, n, n * n])] * mu).astype(F32) + beta).astype(F32)
    pre = (sigmoid_f32(z[..., :n]) + F32(eps_hc)).astype(F32)
    post = (F32(2) * sigmoid_f32(z[..., n:2 * n])).astype(F32)
    logits = z[..., 2 * n:].reshape(z.shape[:-1] + (n, n))
    c0 = (_softmax_rows(logits) + F32(eps_hc)).astype(F32)
    return pre, post, sinkhorn(c0, eps_hc, iters)


def hc_collapse(x, pre) -> np.ndarray:
    """y = rn_bf16(sum_i pre_i x_i): (..., n, d), (..., n) -> (..., d) BF16 values."""
    x = np.asarray(x, F32)
    terms = (np.asarray(pre, F32)[..., :, None] * x).astype(F32)
    return to_bf16(_rsum(terms, axis=-2))


def hc_norm(y, gamma, eps: float) -> np.ndarray:
    """Site RMSNorm with the plain weight: rn_bf16(y r gamma), r = rsqrt(mean(y^2) + eps)."""
    y = np.asarray(y, F32)
    mean = (_rsum(y * y) / F32(y.shape[-1])).astype(F32)
    r = rsqrt_f32(mean + F32(eps))
    return to_bf16(((y * r[..., None]).astype(F32) * np.asarray(gamma, F32)).astype(F32))


def hc_pre(mu, x, alpha, beta, eps_hc: float, iters: int):
    """The hc_pre node: (collapsed BF16 row, post gates, comb) from mu and the streams."""
    x = np.asarray(x, F32)
    pre, post, comb = hc_gates(mu, alpha, beta, x.shape[-2], eps_hc, iters)
    return hc_collapse(x, pre), post, comb


def hc_pre_norm(x, phi, alpha, beta, gamma, *, eps_n: float, eps_hc: float, eps: float,
                iters: int) -> PreMix:
    """The fused pre-mix (mix GEMV, gates, Sinkhorn, collapse) plus the site RMSNorm."""
    mu = hc_mix(x, phi, eps_n)
    y, post, comb = hc_pre(mu, x, alpha, beta, eps_hc, iters)
    return PreMix(y, hc_norm(y, gamma, eps), post, comb)


def hc_rank_sum(partials) -> np.ndarray:
    """u = rn_bf16(sum_rho u^(rho)): (R, ..., d) BF16 partials summed in rank order in FP32."""
    return to_bf16(seq_sum(np.asarray(partials, F32), axis=0))


def hc_post(x, u, post, comb) -> np.ndarray:
    """x'_j = post_j u + sum_i C_ij x_i; x (..., n, d), u (..., d), post (..., n), comb (..., n, n).

    `u` is the BF16 sublayer output (already rank-summed with `hc_rank_sum` under tensor
    parallelism); the output stays FP32."""
    x = np.asarray(x, F32)
    comb = np.asarray(comb, F32)
    # terms[..., j, i, k] = C_ij x_{i,k}
    terms = (np.swapaxes(comb, -1, -2)[..., :, :, None] * x[..., None, :, :]).astype(F32)
    mixed = _rsum(terms, axis=-2)
    gated = (np.asarray(post, F32)[..., :, None] * np.asarray(u, F32)[..., None, :]).astype(F32)
    return (gated + mixed).astype(F32)


def hc_head(x) -> np.ndarray:
    """Head contraction: rn_bf16((sum_i x_i) * fl32(1/n)), (..., n, d) -> (..., d)."""
    x = np.asarray(x, F32)
    inv_n = F32(1) / F32(x.shape[-2])
    return to_bf16((_rsum(x, axis=-2) * inv_n).astype(F32))


# ------------------------------------------------------------------ fused forms
# A fused kernel computes exactly the unfused chain (kernels/glm_mhc_boundary.cuh); these compose the
# functions above in that chain's order, for the GPU tests of the fused forms.


def hc_boundary(x, partials, post_in, comb_in, phi, alpha, beta, gamma, *, eps_n: float, eps_hc: float,
                eps: float, iters: int) -> tuple[np.ndarray, PreMix]:
    """A boundary: the previous site's post-mix (rank sum first), then the next pre-mix and norm.

    Returns (the new streams, the next site's PreMix)."""
    streams = hc_post(x, hc_rank_sum(partials), post_in, comb_in)
    return streams, hc_pre_norm(streams, phi, alpha, beta, gamma, eps_n=eps_n, eps_hc=eps_hc, eps=eps,
                                iters=iters)


def hc_expand_pre_norm(h, n_hc: int, phi, alpha, beta, gamma, *, eps_n: float, eps_hc: float, eps: float,
                       iters: int) -> tuple[np.ndarray, PreMix]:
    """The first site: expand of the BF16 embedding row, then the pre-mix and norm."""
    streams = hc_expand(h, n_hc)
    return streams, hc_pre_norm(streams, phi, alpha, beta, gamma, eps_n=eps_n, eps_hc=eps_hc, eps=eps,
                                iters=iters)


def hc_head_norm(x, gamma, eps: float, weight: str = "one_plus") -> tuple[np.ndarray, np.ndarray]:
    """The stream mean, then the final RMSNorm in rms_norm's order: (head row, normed row)."""
    head = hc_head(x)
    return head, rms_norm(head, gamma, eps, weight)
