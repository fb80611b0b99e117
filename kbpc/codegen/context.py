"""What a family lowering sees of the plan: typed references to buffers, weights and state
(kbpc.codegen.args), the group's nodes and edges, symbols and constants.

Quantized activation buffers are planar: every row's codes, then every row's scales, then one
FP32 scale per row (fp8/token: codes [rows][K], scales [rows]; nvfp4/g16: codes [rows][K/2],
E4M3 scales [rows][K/16], global scales [rows])."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from kbpc.codegen.args import ArenaPtr, CommPtr, FloatLit, StatePtr, WeightPtr, WeightScalar
from kbpc.codegen.collectives import TpStep, tp_step
from kbpc.errors import KbpcError
from kbpc.ir.plan import Buffer, LoweredGroup, Plan
from kbpc.ir.records import Node, Tensor
from kbpc.ir.buffers import buffer_name


class LoweringError(KbpcError):
    """A group cannot be lowered to kernels on this target."""


@dataclass(frozen=True)
class Quant:
    """Planar parts of a quantized activation row set: in the arena, or a quantizer's scratch state."""
    codes: ArenaPtr | StatePtr
    scales: ArenaPtr | StatePtr
    globals: ArenaPtr | StatePtr


class LowerCtx:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.bp = plan.blueprint
        self.sym = self.bp.symbols
        self.c = self.bp.config.constants

    @cached_property
    def _buffers(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.plan.buffers}

    @cached_property
    def tp(self) -> TpStep | None:
        """The collective layout of a tensor-parallel rank's step (None without one)."""
        return tp_step(self.plan)

    @cached_property
    def _weights(self) -> dict[str, int]:
        return {w.name: i for i, w in enumerate(self.plan.weights)}

    @cached_property
    def _state(self) -> dict[str, int]:
        return {s.name: i for i, s in enumerate(self.plan.state)}

    # -- graph queries -------------------------------------------------------------------------
    def nodes(self, group: LoweredGroup) -> list[Node]:
        return [self.bp.node_by_id[n] for n in group.nodes]

    def node(self, group: LoweredGroup, op: str) -> Node:
        found = [n for n in self.nodes(group) if n.op == op or n.op_base == op]
        if len(found) != 1:
            raise LoweringError(f"expected one {op} node, found {len(found)}", f"group {group.id}")
        return found[0]

    def inputs(self, node: Node) -> list[Tensor]:
        return self.bp.inputs(node.order)

    def input(self, node: Node, name: str | None = None, *, op: str | None = None) -> Tensor:
        """The input edge called `name` (last id component), or the one produced by an `op` node,
        or the single non-index input."""
        ins = self.inputs(node)
        if name is not None:
            ins = [t for t in ins if t.id.rsplit(".", 1)[-1] == name]
        elif op is not None:
            ins = [t for t in ins if self.bp.node(t.src).op in (op,) or self.bp.node(t.src).op_base == op]
        else:
            ins = [t for t in ins if t.format != "i32"]
        if not ins:
            raise LoweringError(f"no input {name or op or 'activation'}", f"node {node.id}")
        return ins[0]

    def output(self, node: Node, name: str | None = None) -> Tensor:
        outs = self.bp.outputs(node.order)
        if name is not None:
            outs = [t for t in outs if t.id.rsplit(".", 1)[-1] == name]
        if not outs:
            raise LoweringError(f"no output {name or ''}", f"node {node.id}")
        return outs[0]

    # -- expressions ---------------------------------------------------------------------------
    def buf(self, t: Tensor, ctype: str = "__nv_bfloat16") -> ArenaPtr | CommPtr:
        """Arena pointer of a materialized tensor (a rank's partial sublayer output: its own slot
        of the collective region, kbpc/codegen/collectives.py)."""
        name = buffer_name(self.bp, t)
        site = self.tp.site(name) if self.tp is not None else None
        if site is not None:
            return self.tp.slot(site, self.tp.rank, ctype)
        b = self._buffers.get(name)
        if b is None:
            raise LoweringError(f"tensor {t.id} is not materialized (fused inside a group?)", f"edge {t.id}")
        return ArenaPtr(name, b.offset, ctype)

    def in_place(self, parts: list[Tensor], whole: Tensor) -> bool:
        """Whether the buffers of `parts` lie back to back inside `whole`'s buffer, in order (a
        concat written in place by memory planning)."""
        name = buffer_name(self.bp, whole)
        bufs = [self._buffers.get(buffer_name(self.bp, t)) for t in parts]
        if any(b is None or b.alias_of != name for b in bufs):
            return False
        offset = self._buffers[name].offset
        for b in bufs:
            if b.offset != offset:
                return False
            offset += b.nbytes
        return True

    def rows(self, t: Tensor) -> int:
        b = self._buffers.get(buffer_name(self.bp, t))
        per_row = t.dim_value
        return max(1, b.elements // per_row) if b else 1

    def quant(self, t: Tensor) -> Quant:
        """Planar parts of a quantized activation buffer."""
        name = buffer_name(self.bp, t)
        b = self._buffers[name]
        k, rows = t.dim_value, self.rows(t)
        if t.format == "fp8/token":
            codes, scales = b.offset, b.offset + rows * k
            return Quant(ArenaPtr(name, codes, "uint8_t"), ArenaPtr(name, scales, "float"), ArenaPtr(name, scales, "float"))
        if t.format == "nvfp4/g16":
            codes = b.offset
            scales = codes + rows * k // 2
            globs = scales + rows * k // 16
            return Quant(ArenaPtr(name, codes, "uint8_t"), ArenaPtr(name, scales, "uint8_t"), ArenaPtr(name, globs, "float"))
        raise LoweringError(f"{t.format} is not a quantized format", f"edge {t.id}")

    def weight(self, node: Node | str, suffix: str = "weight", ctype: str = "uint8_t") -> WeightPtr:
        name = f"{node if isinstance(node, str) else node.id}.{suffix}"
        if name not in self._weights:
            raise LoweringError(f"no weight {name}")
        return WeightPtr(self._weights[name], name, ctype)

    def weight_value(self, node: Node | str, suffix: str) -> WeightScalar:
        """The host value of a one-element FP32 weight (a static scale): the runtime copies every
        one-element weight to the host once at create time."""
        name = f"{node if isinstance(node, str) else node.id}.{suffix}"
        if name not in self._weights:
            raise LoweringError(f"no weight {name}")
        return WeightScalar(self._weights[name], name)

    def state(self, name: str, ctype: str) -> StatePtr:
        if name not in self._state:
            raise LoweringError(f"no state buffer {name}")
        return StatePtr(self._state[name], name, ctype)


def flt(x: float) -> FloatLit:
    """An FP32 constant argument (the nearest float to x; must be finite)."""
    return FloatLit(float(x))
