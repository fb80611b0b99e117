"""Activation buffers: the one home for a materialized tensor's name and size. A tensor that
crosses groups (kbpc/ir/grouping.py) gets an arena buffer named after its producer node and output;
every edge with that id (a tensor may fan out to several readers) shares it."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kbpc.ir.formats import FORMATS
from kbpc.ir.records import Tensor

if TYPE_CHECKING:
    from kbpc.ir.graph import Blueprint


def buffer_name(bp: Blueprint, t: Tensor) -> str:
    """`<producer node id>.<output name>` (the last component of the edge id)."""
    return f"{bp.node(t.src).id}.{t.id.rsplit('.', 1)[-1]}"


def buffer_elements(bp: Blueprint, t: Tensor) -> int:
    """Values per row of one tensor. The indexer's selection edge counts pools; the buffer the
    decode reads holds token ids: (top-k pools + the tail pool) x tokens per pool."""
    if bp.node(t.src).op == "index_select":
        return (t.dim_value + 1) * bp.symbols["index_kpool"]
    return t.dim_value


def buffer_rows(t: Tensor, batch: int) -> int:
    """Rows of a tensor in a step of `batch` tokens (the front end resolved rows per token)."""
    return t.rows_per_token * batch


# Activation formats an act_quant writes. Without activation quantization (Options.act_quant off)
# such an edge carries the BF16 row its act_quant read (kbpc/reference/no_act_quant.py).
QUANTIZED_ACTIVATIONS = frozenset({"fp8/token", "nvfp4/g16"})


def carried_format(t: Tensor, act_quant: bool = True) -> str:
    """The format a tensor's buffer holds: its own, or BF16 for a quantized activation when the
    build keeps activations unquantized."""
    return "bf16" if not act_quant and t.format in QUANTIZED_ACTIVATIONS else t.format


def buffer_bytes(bp: Blueprint, t: Tensor, batch: int, act_quant: bool = True) -> int:
    return FORMATS[carried_format(t, act_quant)].row_bytes(buffer_elements(bp, t)) * buffer_rows(t, batch)
