"""causal_conv1d_l2norm: causal depthwise conv update + SiLU + L2 norm of the q/k heads (KDA, GDN).

Math (explain.families.causal_conv1d_l2norm), per channel c with window s_c in R^w (oldest first):

    s_c <- (s_{c,2}, ..., s_{c,w}, x_{t,c}),   u_{t,c} = silu(b_c + sum_{i=1..w} W_{c,i} s_{c,i})
    y_{t,c} = u_{t,c} (sum_{j in H(c)} u_{t,j}^2 + eps)^{-1/2}   for c < c_qk,   u_{t,c} otherwise
    token form: s^(t)_{c,i} = x_{t-w+i,c}, x_{j,c} for j <= 0 read from the stored window slot j+w

Numerics: FP32 window; BF16 inputs and taps widened exactly; the conv sum starts from the bias and
adds the taps oldest to newest, each product rounded first (no FMA); sigmoid via expf; the squared
norm is a shuffle-down tree within each 32-lane warp, then the d_k/32 warp partials summed in order;
scale rsqrtf(sum + eps), eps added to the sum (not to a mean); BF16 (RNE) or FP32 store.

Choices: silu(a) = fl(a * sigma(a)) with sigma(a) = fl(1 / fl(1 + expf(-a))) (the kernel forms the
sigmoid, then multiplies); no bias (None) means the sum starts from +0.0; y = fl(u * scale); the
window is updated before the sum, so the newest tap W_{c,w} multiplies x_t. The state is explicit
and pure: functions take the window (..., C, w) and return the advanced one; leading axes are
independent sequences (the _rows form). Channel layout: [q | k | v], c_qk = q+k channels.
"""
from __future__ import annotations

import numpy as np

from kbpc.reference.f32ops import WARP, rsqrt_f32, sigmoid_f32
from kbpc.reference.formats import to_bf16
from kbpc.reference.fp32 import seq_sum, tree_sum

F32 = np.float32


def window_advance(window, x) -> np.ndarray:
    """Move a window (..., C, w) past tokens x (..., T, C): the last w inputs, oldest first."""
    window = np.asarray(window, F32)
    x = np.asarray(x, F32)
    hist = np.concatenate([window, np.swapaxes(x, -1, -2)], axis=-1)
    return hist[..., -window.shape[-1]:].copy()


def conv1d_update(x, window, weight, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """One token: (u FP32 (..., C), new window (..., C, w)) from x (..., C), window (..., C, w)."""
    x = np.asarray(x, F32)
    new = window_advance(window, x[..., None, :])
    terms = (np.asarray(weight, F32) * new).astype(F32)  # (..., C, w), oldest first
    start = np.zeros(x.shape, F32) if bias is None else np.broadcast_to(np.asarray(bias, F32),
                                                                          x.shape)
    acc = seq_sum(terms, axis=-1, start=start)
    return (acc * sigmoid_f32(acc)).astype(F32), new


def conv1d_tokens(x, window, weight, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """T consecutive tokens of one sequence: (u (..., T, C), window after the last token)."""
    x = np.asarray(x, F32)
    outs = []
    for t in range(x.shape[-2]):
        u, window = conv1d_update(x[..., t, :], window, weight, bias)
        outs.append(u)
    return np.stack(outs, axis=-2), np.asarray(window, F32)


def head_sum_squares(u, d_k: int) -> np.ndarray:
    """Per d_k-head sum of squares: (..., n*d_k) -> (..., n), warp trees then warps in order."""
    if d_k % WARP:
        raise ValueError(f"head width {d_k} is not a multiple of {WARP}")
    u = np.asarray(u, F32)
    heads = u.shape[-1] // d_k
    sq = (u * u).astype(F32).reshape(u.shape[:-1] + (heads, d_k // WARP, WARP))
    return seq_sum(tree_sum(sq, axis=-1), axis=-1)


def l2norm_heads(u, c_qk: int, d_k: int, eps: float, out: str = "bf16") -> np.ndarray:
    """The l2_norm op: q/k heads (channels < c_qk) L2-normalised, value channels passed through."""
    u = np.asarray(u, F32)
    if c_qk % d_k or c_qk > u.shape[-1]:
        raise ValueError(f"c_qk={c_qk} is not a whole number of d_k={d_k} heads within the row")
    qk = u[..., :c_qk]
    scale = rsqrt_f32((head_sum_squares(qk, d_k) + F32(eps)).astype(F32))
    y = np.concatenate([(qk * np.repeat(scale, d_k, axis=-1)).astype(F32), u[..., c_qk:]], axis=-1)
    if out == "bf16":
        return to_bf16(y)
    if out == "f32":
        return y
    raise ValueError(f"output format must be 'bf16' or 'f32', got {out!r}")


def causal_conv1d_update_l2norm(x, window, weight, bias, *, c_qk: int, d_k: int, eps: float,
                                out: str = "bf16") -> tuple[np.ndarray, np.ndarray]:
    """Fused conv update + SiLU + head L2 norm for one token: (y (..., C), new window)."""
    u, new = conv1d_update(x, window, weight, bias)
    return l2norm_heads(u, c_qk, d_k, eps, out), new


def causal_conv1d_update_l2norm_tokens(x, window, weight, bias, *, c_qk: int, d_k: int,
                                       eps: float, out: str = "bf16"):
    """Token form over x (..., T, C): (y (..., T, C), window advanced past the T tokens)."""
    u, new = conv1d_tokens(x, window, weight, bias)
    return l2norm_heads(u, c_qk, d_k, eps, out), new
