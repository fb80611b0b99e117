"""The fused KDA decode kernel builds through the product's launcher template (a compile-time
cluster kernel launched with cudaLaunchKernelEx) at the seed's sizes and at odd small sizes, for
sm_90a without register spills and within static shared memory, and for sm_121a (no GPU needed)."""
from __future__ import annotations

import re
import subprocess

import pytest

from kbpc.toolchain.nvcc import BASE_FLAGS, KERNELS_DIR, RUNTIME_STUB_DIR, compile_cuda, nvcc_path
from kbpc.codegen.families.kda_fused import KdaDims, KdaShape, instance, smem_bytes, value_head_split
from kbpc.targets import get_target
from kbpc.testing.launchers import render_instance

pytestmark = pytest.mark.nvcc

# (H_k, H_v, d_k, d_v, K_f, K_g, conv width): the seed; grouped heads with d_k != d_v, width 3 and
# two gate ranks; the tiny example's split.
SHAPES = [(64, 64, 128, 128, 128, 128, 4), (1, 3, 32, 64, 128, 256, 3), (2, 2, 128, 128, 128, 128, 4)]


def _shape(hk, hv, dk, dv, kf, kg, w) -> KdaShape:
    return KdaShape(KdaDims(hk, hv, dk, dv, kf, kg, w), value_head_split(hk, hv, dk, dv, w))


@pytest.mark.parametrize("dims", SHAPES)
def test_fused_kernel_has_no_spills(dims, tmp_path):
    """ptxas's resource report for the instance's sm_90a code: no spills, the planned shared memory."""
    shape = _shape(*dims)
    src = tmp_path / "kda_fused.cu"
    src.write_text(render_instance(instance(shape)))
    cmd = [nvcc_path(), *BASE_FLAGS, *get_target("sm_90").gencode, "-cubin", "-Xptxas", "-v",
           f"-I{KERNELS_DIR}", f"-I{RUNTIME_STUB_DIR}", str(src), "-o", str(tmp_path / "k.cubin")]
    log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", log)]
    smem = [int(n) for n in re.findall(r"(\d+) bytes smem", log)]
    assert spills and max(spills) == 0, log
    d = shape.dims
    assert smem == [smem_bytes(d.hk, d.hv, d.dk, d.dv, d.width, shape.cph)], log


@pytest.mark.parametrize("target,dims", [("sm_90", SHAPES[0]), ("sm_121", SHAPES[1])])
def test_fused_launcher_builds(target, dims, tmp_path):
    """The launcher TU (host cudaLaunchKernelEx of a compile-time cluster kernel) compiles."""
    src = tmp_path / "kda_fused.cu"
    src.write_text(render_instance(instance(_shape(*dims))))
    flags = ("-O1",) if target == "sm_121" else ()
    compile_cuda(src, tmp_path / "kda_fused.o", get_target(target), kind="obj", extra_flags=flags)
