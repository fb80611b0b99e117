"""The format registry: one frozen record per tensor format of the kbp-graph schema.

Byte counts follow `explain.formats` of the schema: an activation row of `dim` values carries its
scales with it (one FP32 per row for fp8/token and nvfp4/g16, plus one E4M3 byte per 16 values for
nvfp4); a weight of N x K carries its scales per output channel (fp8/channel) or per tensor (nvfp4).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    name: str
    bits: int                 # bits per stored value
    cpp_type: str             # element type in generated C++
    block: int | None         # values per block scale (nvfp4: 16)
    scale: str | None         # None, "row", "channel", "tensor+block"
    quantized: bool

    def row_bytes(self, dim: int) -> int:
        """Bytes of one activation row of `dim` values, scales included."""
        if self.name == "nvfp4/g16":
            return dim // 2 + dim // 16 + 4
        if self.name == "fp8/token":
            return dim + 4
        if self.name == "fp8/channel":
            return dim + 4
        return dim * self.bits // 8


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("bf16", 16, "__nv_bfloat16", None, None, False),
        Format("f32", 32, "float", None, None, False),
        Format("i32", 32, "int32_t", None, None, False),
        Format("fp8/channel", 8, "uint8_t", None, "channel", True),
        Format("fp8/token", 8, "uint8_t", None, "row", True),
        Format("nvfp4/g16", 4, "uint8_t", 16, "tensor+block", True),
    )
}


def is_known(name: str) -> bool:
    return name in FORMATS
