"""Typed launch arguments: what a family lowering passes to a kernel, before any C++ is written.

A lowering never writes C++ text for an argument: it builds one of these records, and
kbpc.codegen.render_args is the only place that turns them into expressions (and the only place
that writes pointer casts). Launch passes and tests can therefore ask what a launch reads and
writes (`arena_buffers`), and the harness in kbpc.testing.launchers can bind the same launch to
test buffers.

Step-program scope (templates/step.cu.j2): A is the arena base, W[i] weight i, S[i] state buffer i,
WS[i] the host copy of one-element weight i, TOKEN/POS/SEQ device ints of the step, COMM the
collective region (tensor parallelism)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

# sizeof of the element types lowerings point at (pointer arithmetic is done here, in bytes).
CTYPE_BYTES = {"__nv_bfloat16": 2, "float": 4, "uint8_t": 1, "int": 4, "int32_t": 4, "uint16_t": 2,
               "unsigned int": 4, "void": 1}


def _base_ctype(ctype: str) -> str:
    return ctype.removeprefix("const ").strip()


@dataclass(frozen=True)
class ArenaPtr:
    """A pointer into the activation arena: buffer `buffer` at `offset` bytes (its arena offset plus
    any offset into it), as `ctype*`."""
    buffer: str
    offset: int
    ctype: str = "__nv_bfloat16"

    def plus(self, elements: int) -> ArenaPtr:
        """The pointer `elements` values of ctype further on."""
        return ArenaPtr(self.buffer, self.offset + elements * CTYPE_BYTES[_base_ctype(self.ctype)], self.ctype)


@dataclass(frozen=True)
class CommPtr:
    """A pointer into the rank's collective region (tensor parallelism, kbpc/codegen/collectives.py):
    `offset` bytes from its start, as `ctype*`. Rendered against COMM, the step's region."""
    offset: int
    ctype: str = "__nv_bfloat16"

    def plus(self, elements: int) -> CommPtr:
        return CommPtr(self.offset + elements * CTYPE_BYTES[_base_ctype(self.ctype)], self.ctype)


@dataclass(frozen=True)
class WeightPtr:
    """Device weight tensor `index` (the plan's weight list), as `const ctype*`."""
    index: int
    name: str
    ctype: str = "uint8_t"


@dataclass(frozen=True)
class WeightScalar:
    """The host FP32 value of one-element weight `index` (a static scale), read once at create."""
    index: int
    name: str


@dataclass(frozen=True)
class StatePtr:
    """Sequence-state buffer `index` (the plan's state list), as `ctype*`."""
    index: int
    name: str
    ctype: str


@dataclass(frozen=True)
class StepInput:
    """A device int of the step: TOKEN (this step's token id), POS (its 0-based position) or SEQ
    (cached tokens after this step's writes, POS + 1)."""
    which: str

    def __post_init__(self):
        if self.which not in ("TOKEN", "POS", "SEQ"):
            raise ValueError(f"unknown step input {self.which!r}")


@dataclass(frozen=True)
class IntLit:
    value: int


@dataclass(frozen=True)
class FloatLit:
    """An FP32 constant: the nearest float to `value`, which must be finite."""
    value: float

    def __post_init__(self):
        if not math.isfinite(self.value):
            raise ValueError(f"not a finite constant: {self.value}")


@dataclass(frozen=True)
class NullPtr:
    pass


@dataclass(frozen=True)
class Aggregate:
    """A brace-initialised value: `ctype{fields...}`, or a bare `{fields...}` (an array member)
    when ctype is None. Field order is the C++ member order."""
    ctype: str | None
    fields: tuple[Arg, ...]


Arg = Union[ArenaPtr, CommPtr, WeightPtr, WeightScalar, StatePtr, StepInput, IntLit, FloatLit, NullPtr, Aggregate]

NULL = NullPtr()


def lit(value: int) -> IntLit:
    return IntLit(int(value))


def walk(arg: Arg):
    """The argument and every argument nested inside it."""
    yield arg
    if isinstance(arg, Aggregate):
        for f in arg.fields:
            yield from walk(f)


def arena_buffers(args: tuple[Arg, ...]) -> set[str]:
    """Names of the arena buffers a launch's arguments point into."""
    return {a.buffer for arg in args for a in walk(arg) if isinstance(a, ArenaPtr)}
