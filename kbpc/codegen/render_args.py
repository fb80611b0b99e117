"""Typed launch arguments -> C++ expressions of the step program. The only module that writes
pointer casts; templates call `render_arg` (registered as the Jinja filter `cxx`)."""
from __future__ import annotations

from functools import singledispatch

from kbpc.codegen.args import (Aggregate, ArenaPtr, CommPtr, FloatLit, IntLit, NullPtr, StatePtr, StepInput,
                               WeightPtr, WeightScalar)
from kbpc.codegen.records import Collective


@singledispatch
def render_arg(arg) -> str:
    raise TypeError(f"not a launch argument: {arg!r}")


@render_arg.register
def _(arg: ArenaPtr) -> str:
    return f"(({arg.ctype}*)(A + {arg.offset}))"


@render_arg.register
def _(arg: CommPtr) -> str:
    return f"(({arg.ctype}*)(COMM + {arg.offset}))"


@render_arg.register
def _(arg: WeightPtr) -> str:
    ctype = arg.ctype if arg.ctype.startswith("const ") else f"const {arg.ctype}"
    return f"(({ctype}*)W[{arg.index}])"


@render_arg.register
def _(arg: WeightScalar) -> str:
    return f"WS[{arg.index}]"


@render_arg.register
def _(arg: StatePtr) -> str:
    return f"(({arg.ctype}*)S[{arg.index}])"


@render_arg.register
def _(arg: StepInput) -> str:
    return arg.which


@render_arg.register
def _(arg: IntLit) -> str:
    return str(arg.value)


@render_arg.register
def _(arg: FloatLit) -> str:
    return f"{float(arg.value)!r}f"


@render_arg.register
def _(arg: NullPtr) -> str:
    return "nullptr"


@render_arg.register
def _(arg: Aggregate) -> str:
    body = ", ".join(render_arg(f) for f in arg.fields)
    return f"{arg.ctype}{{{body}}}" if arg.ctype else f"{{{body}}}"


def launcher_decl(inst) -> str:
    """The declaration of a kernel instance's typed host launcher (defined in its own TU)."""
    params = "".join(f", {p}" for p in inst.params)
    return f"cudaError_t kbp_launch_{inst.name}(dim3, dim3, size_t, cudaStream_t, int{params});"


def launch_call(launch, stream: str) -> str:
    """A call of the launcher for one launch: grid, block, dynamic shared memory, stream, the flags
    (bit 0 programmatic dependent launch, bit 1 the highest priority) and the rendered arguments (a
    collective: the runtime's all-gather of its slots)."""
    if isinstance(launch, Collective):
        return f"kbp_tp_all_gather(COMM + {launch.offset}, {launch.slot_bytes}ull, {stream})"
    args = "".join(f", {render_arg(a)}" for a in launch.args)
    return (f"kbp_launch_{launch.instance.name}(dim3({', '.join(map(str, launch.grid))}), "
            f"dim3({', '.join(map(str, launch.block))}), {launch.smem}, {stream}, {int(launch.pdl) | int(launch.priority) << 1}{args})")
