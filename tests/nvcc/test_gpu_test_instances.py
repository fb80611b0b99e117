"""Every kernel instance the GPU tests launch through the product's launchers builds for sm_90 (and
the way the test builds it; no GPU needed). Each tests/gpu module below lists its instances (`instances()`); they are rendered
with the product's kernel-instance template, one translation unit per module, each followed by a
compile-time check that the instance's parameter types are exactly the kernel's: the launcher
converts every argument to those types, and cudaLaunchKernelEx would silently convert a value of
another arithmetic type."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from kbpc.codegen.emit import _env
from kbpc.codegen.records import KernelInstance
from kbpc.errors import BuildError
from kbpc.targets import get_target
from kbpc.testing.instances import dense
from kbpc.toolchain.nvcc import compile_cuda

pytestmark = [pytest.mark.nvcc, pytest.mark.slow]

GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"
MODULES = ["test_gpu_projections", "test_gpu_w4a16_mma", "test_gpu_w4a16_mma_pair", "test_gpu_gemv_split",
           "test_gpu_glue_projections", "test_gpu_norms", "test_gpu_dsa_lowering_forms", "test_gpu_kda", "test_gpu_misc", "test_gpu_misc_mhc",
           "test_gpu_router_expert_quant", "test_gpu_mla_decode_fast", "test_gpu_moe_experts",
           "test_gpu_dsa_order_free", "test_gpu_dense_scores_only", "test_gpu_moe_swiglu_down"]
# Modules whose tests also launch the headers' fast-math build (-DKBP_FAST_MATH) and whose kernels
# were compile-tested for sm_121 as well (their former wrappers were): built those ways too.
FAST_AND_SM121 = (("sm_90", ("-DKBP_FAST_MATH",)), ("sm_121", ()))
ALSO = {"test_gpu_misc": FAST_AND_SM121, "test_gpu_misc_mhc": FAST_AND_SM121}
BUILDS = [(m, "sm_90", ()) for m in MODULES] + [(m, t, f) for m, ways in ALSO.items() for t, f in ways]


def _instances(module: str) -> list[KernelInstance]:
    if str(GPU_TESTS) not in sys.path:   # as pytest's rootdir import puts it for tests/gpu
        sys.path.insert(0, str(GPU_TESTS))
    return sorted(set(importlib.import_module(module).instances()), key=lambda i: i.name)


def checked_source(insts: list[KernelInstance]) -> str:
    """The instances' launcher TUs in one unit, each with a static_assert of its exact signature."""
    template = _env().get_template("kernel_instance.cu.j2")
    parts = ["#include <type_traits>"]
    for inst in insts:
        parts.append(template.render(inst=inst))
        parts.append(f"static_assert(std::is_same<decltype(&{inst.kernel}), void (*)({', '.join(inst.params)})>::value,"
                     f' "{inst.name}: the parameter types are not the kernel\'s");')
    return "\n".join(parts) + "\n"


def test_signature_check_catches_a_wrong_type(tmp_path):
    """The check is live: a float where the kernel takes an int (which the launch itself would
    convert) fails to compile."""
    good = dense(128, "float")
    bad = KernelInstance(good.family, good.header, good.kernel, good.params[:-1] + ("float",))
    src = tmp_path / "bad.cu"
    src.write_text(checked_source([bad]))
    with pytest.raises(BuildError, match="parameter types"):
        compile_cuda(src, tmp_path / "bad.o", get_target("sm_90"), kind="obj")


@pytest.mark.parametrize("module,target,flags", BUILDS)
def test_gpu_test_instances_build(module, target, flags, tmp_path):
    insts = _instances(module)
    assert insts, f"{module} lists no instances"
    src = tmp_path / f"{module}.cu"
    src.write_text(checked_source(insts))
    compile_cuda(src, tmp_path / f"{module}.o", get_target(target), kind="obj", extra_flags=flags)
