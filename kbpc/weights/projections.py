"""Checkpoint projections (a module's `weight` and its ModelOpt companions) in kbpc's stored forms.

ModelOpt's export layouts, per quant_algo (hf_quant_config.json), for a projection of N outputs
and K inputs:

    NVFP4               weight U8 [N, K/2] (two E2M1 codes, low nibble first), weight_scale
                        F8_E4M3 [N, K/16], weight_scale_2 F32 [], input_scale F32 [] (static)
    W4A16_NVFP4         the same without input_scale
    FP8_PER_CHANNEL_PER_TOKEN  weight F8_E4M3 [N, K], weight_scale F32 [N] (activations dynamic)
    FP8                 weight F8_E4M3 [N, K], weight_scale F32 [], input_scale F32 []
    unquantized         weight BF16, F16 or F32 [N, K]

They map onto the blueprint's weight formats without arithmetic (nvfp4/g16, fp8/channel with a
per-tensor scale repeated per channel, bf16), except F16/F32 weights, which round to BF16."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.errors import WeightsError
from kbpc.reference.formats import bf16_bits, bf16_from_bits, dequantize_fp8, dequantize_nvfp4
from kbpc.weights.mapping import Context, Need

F32 = np.float32


@dataclass(frozen=True)
class Layout:
    fmt: str                                           # the kbpc weight format it maps onto
    tensors: tuple[tuple[str, tuple[str, ...], str], ...]  # suffix, dtypes, shape kind


LAYOUTS: dict[str | None, Layout] = {
    "NVFP4": Layout("nvfp4/g16", (("weight", ("U8",), "n,k/2"), ("weight_scale", ("F8_E4M3",), "n,k/16"),
                                  ("weight_scale_2", ("F32",), "scalar"), ("input_scale", ("F32",), "scalar"))),
    "W4A16_NVFP4": Layout("nvfp4/g16", (("weight", ("U8",), "n,k/2"), ("weight_scale", ("F8_E4M3",), "n,k/16"),
                                        ("weight_scale_2", ("F32",), "scalar"))),
    "FP8_PER_CHANNEL_PER_TOKEN": Layout("fp8/channel", (("weight", ("F8_E4M3",), "n,k"),
                                                        ("weight_scale", ("F32",), "n"))),
    "FP8": Layout("fp8/channel", (("weight", ("F8_E4M3",), "n,k"), ("weight_scale", ("F32",), "scalar"),
                                  ("input_scale", ("F32",), "scalar"))),
    None: Layout("bf16", (("weight", ("BF16", "F16", "F32"), "n,k"),)),
}

_SHAPES = {"n,k/2": lambda n, k: (n, k // 2), "n,k/16": lambda n, k: (n, k // 16), "n,k": lambda n, k: (n, k),
           "n": lambda n, k: (n,), "scalar": lambda n, k: ()}


@dataclass(frozen=True)
class Projection:
    """One checkpoint projection in stored forms: weight (e2m1x2 bytes, e4m3 codes or bf16 bits),
    scale (E4M3 block scales or FP32 per channel), scale2 and input_scale (FP32 or None)."""
    module: str
    fmt: str
    weight: np.ndarray
    scale: np.ndarray | None = None
    scale2: np.float32 | None = None
    input_scale: np.float32 | None = None

    def dequantized(self) -> np.ndarray:
        """The weight as FP32 values [N, K]."""
        if self.fmt == "nvfp4/g16":
            return dequantize_nvfp4(self.weight, self.scale, self.scale2)
        if self.fmt == "fp8/channel":
            return dequantize_fp8(self.weight, self.scale)
        return bf16_from_bits(self.weight)


def layout_of(ctx: Context, module: str, what: str) -> Layout:
    fmt = ctx.folder.quant.format_of(module)
    layout = LAYOUTS.get(fmt.algo)
    if layout is None:
        raise WeightsError(f"{module} is quantized as {fmt.algo}; kbpc reads ModelOpt "
                           f"{', '.join(a for a in LAYOUTS if a)} or unquantized projections ({what})",
                           ctx.folder.quant.source)
    if layout.fmt == "nvfp4/g16" and fmt.group_size not in (0, 16):
        raise WeightsError(f"{module} uses NVFP4 groups of {fmt.group_size}; nvfp4/g16 needs 16 ({what})",
                           ctx.folder.quant.source)
    return layout


def projection_needs(ctx: Context, module: str, n: int, k: int, what: str,
                     fmts: tuple[str, ...] | None = None, input_scale: bool = False) -> list[Need]:
    """The tensors of `module` as an N x K projection; `fmts`: the kbpc formats acceptable without
    re-quantizing (None: any, the caller dequantizes); `input_scale`: a static activation scale is
    needed too."""
    layout = layout_of(ctx, module, what)
    algo = ctx.folder.quant.format_of(module).algo
    if fmts is not None and layout.fmt not in fmts:
        raise WeightsError(f"{module} is stored {algo or 'unquantized'} ({layout.fmt}), but {what} needs "
                           f"{' or '.join(fmts)} weights; kbpc does not re-quantize it", ctx.folder.quant.source)
    names = [t[0] for t in layout.tensors]
    if input_scale and "input_scale" not in names:
        raise WeightsError(f"{module} is stored {algo or 'unquantized'} without a static input_scale, but "
                           f"{what} quantizes its input with one (export it as NVFP4 W4A4)", ctx.folder.quant.source)
    return [Need(f"{module}.{suffix}", dtypes, _SHAPES[kind](n, k), f"{algo or 'unquantized'} {suffix} for {what}")
            for suffix, dtypes, kind in layout.tensors]


def read_projection(ctx: Context, module: str) -> Projection:
    """The tensors `projection_needs` checked, in stored forms."""
    layout = layout_of(ctx, module, module)
    parts = {suffix: ctx.read(f"{module}.{suffix}") for suffix, _, _ in layout.tensors}
    if layout.fmt == "bf16":
        w = parts["weight"]
        bits = w if w.dtype == np.uint16 else bf16_bits(np.asarray(w, F32))
        return Projection(module, "bf16", np.asarray(bits, np.uint16))
    if layout.fmt == "fp8/channel":
        w = np.asarray(parts["weight"], np.uint8)
        scale = np.broadcast_to(np.asarray(parts["weight_scale"], F32), w.shape[:1]).astype(F32)
        return Projection(module, "fp8/channel", w, scale)
    return Projection(module, "nvfp4/g16", np.asarray(parts["weight"], np.uint8),
                      np.asarray(parts["weight_scale"], np.uint8), F32(parts["weight_scale_2"]),
                      F32(parts["input_scale"]) if "input_scale" in parts else None)
