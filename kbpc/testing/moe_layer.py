"""The fused MoE layer's kernels for GPU tests and benchmarks: extern "C" wrappers of
moe_gate_up_dev / moe_down_dev at planned shapes, and their argument lists in kernel order.

PyCUDA is imported lazily (nothing here touches a GPU until a function that launches is called).
Until the typed launch layer lands, this is how tests instantiate the kernels; then they move to
kbpc.testing.launchers with the product's generated launchers."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kbpc.codegen.families.glm_moe_layer import MoeKernelPlan, THREADS

GATE_UP_PARAMS = (
    "const __nv_bfloat16* xn", "const __nv_bfloat16* wr", "const float* bias", "float rs", "float ggu",
    "const uint8_t* gc", "const uint8_t* gs", "const float* gsg", "float gdn", "float lim", "const uint8_t* shc",
    "const uint8_t* shs", "float shsg", "float* tw", "int* ti", "uint8_t* dc", "uint8_t* ds", "float* shx",
    "float* lg", "__nv_bfloat16* egu", "__nv_bfloat16* sgu", "const uint8_t* nxc", "const uint8_t* nxs", "int nxr")
DOWN_PARAMS = (
    "const int* ti", "const float* tw", "const uint8_t* dc", "const uint8_t* ds", "float gdn", "const uint8_t* wc",
    "const uint8_t* ws", "const float* wsg", "const float* shx", "const uint8_t* sc", "const uint8_t* ss",
    "float ssg", "__nv_bfloat16* ed", "__nv_bfloat16* sd", "__nv_bfloat16* y")


def _names(params: tuple[str, ...]) -> str:
    return ", ".join(p.rsplit(" ", 1)[1] for p in params)


def wrapper(name: str, plan: MoeKernelPlan) -> str:
    """An extern "C" kernel `name` running plan.kernel's device body."""
    params = GATE_UP_PARAMS if "moe_gate_up" in plan.kernel else DOWN_PARAMS
    body = plan.kernel.replace("kbp::moe_gate_up<", "kbp::moe_gate_up_dev<").replace("kbp::moe_down<", "kbp::moe_down_dev<")
    return (f'extern "C" __global__ void __launch_bounds__({THREADS}, 2) {name}({", ".join(params)}) '
            f"{{ {body}({_names(params)}); }}\n")


def source(kernels: dict[str, MoeKernelPlan]) -> str:
    return '#include <cuda_bf16.h>\n#include "glm_moe_layer.cuh"\n' + "".join(
        wrapper(name, plan) for name, plan in kernels.items())


def null() -> np.uintp:
    return np.uintp(0)


@dataclass(frozen=True)
class Launcher:
    """A loaded wrapper with its dynamic shared memory raised and its plan's launch shape."""
    fn: object
    plan: MoeKernelPlan

    def __call__(self, *args, grid: int | None = None, stream=None) -> None:
        self.fn(*args, block=(THREADS, 1, 1), grid=(grid or self.plan.grid, 1), shared=self.plan.smem,
                stream=stream)


def launcher(module, name: str, plan: MoeKernelPlan) -> Launcher:
    import pycuda.driver as cuda  # noqa: PLC0415

    fn = module.get_function(name)
    fn.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, plan.smem)
    return Launcher(fn, plan)


def sm_count() -> int:
    import pycuda.autoprimaryctx  # noqa: F401, PLC0415
    import pycuda.driver as cuda  # noqa: PLC0415

    return cuda.Context.get_device().get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
