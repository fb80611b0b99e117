"""The fused MoE layer kernel (kbp::moe_layer) for GPU tests and benchmarks, through the product's
own launcher (kbpc.testing.launchers): named arguments bound in the kernel's order, and both
phases launched back to back.

PyCUDA is imported lazily (nothing here touches a GPU until a launch)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kbpc.codegen.families.glm_moe_layer import PARAM_NAMES, THREADS, MoeLayerPlan

F32 = np.float32
SCALARS = {"routed_scale", "gamma_gu", "gamma_dn", "limit", "sh_sg", "shd_sg"}


@dataclass(frozen=True)
class MoeLayerRun:
    """A loaded instance and its plan."""
    plan: MoeLayerPlan
    launch: object   # kbpc.testing.launchers.Launcher

    def args(self, phase: int, **named) -> tuple:
        """The argument tuple of a phase: every name of PARAM_NAMES but `phase`; pointers are
        GPUArrays or None (null), FP32 scalars are converted, prefetch_rows defaults to 0."""
        named.setdefault("prefetch_rows", 0)
        unknown = set(named) - set(PARAM_NAMES)
        missing = set(PARAM_NAMES[1:]) - set(named)
        if unknown or missing:
            raise TypeError(f"moe_layer arguments: unknown {sorted(unknown)}, missing {sorted(missing)}")
        vals = {n: (F32(v) if n in SCALARS else v) for n, v in named.items()}
        vals["prefetch_rows"] = np.int32(vals["prefetch_rows"])
        return (np.int32(phase), *(vals[n] for n in PARAM_NAMES[1:]))

    def __call__(self, grid: int | None = None, pdl: bool = False, **named) -> None:
        """Phase 0 then phase 1 on the default stream (no synchronization)."""
        for phase, p in ((0, self.plan.gate_up), (1, self.plan.down)):
            self.launch((grid or p.grid, 1, 1), (THREADS, 1, 1), *self.args(phase, **named), smem=p.smem, pdl=pdl,
                        sync=False)


def load(plans: list[MoeLayerPlan]) -> list[MoeLayerRun]:
    """Build the instances' launchers (nvcc in parallel), in order."""
    from kbpc.testing.gpu import _cuda  # noqa: PLC0415
    from kbpc.testing.launchers import launcher  # noqa: PLC0415

    _cuda()  # PyCUDA's context is made current in this thread, before any worker imports it
    with ThreadPoolExecutor(max(1, len(plans))) as pool:
        launches = list(pool.map(lambda p: launcher(p.instance()), plans))
    return [MoeLayerRun(p, l) for p, l in zip(plans, launches)]


def sm_count() -> int:
    from kbpc.testing.gpu import _cuda  # noqa: PLC0415

    cuda = _cuda()
    return cuda.Context.get_device().get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT)
