"""The DSA kernel instances the lowerings emit for the seed and the tiny blueprint (FP32 and FP8
index caches, the store with the key's LayerNorm, the FP8 rotated-query form, the tensor-core form, the
order-free forms, 4 and 2 heads per decode CTA, the fast decode) compile through the
product's kernel-instance template for sm_90a without register spills, within the static shared
memory limit (no GPU needed)."""
from __future__ import annotations

import re
import subprocess

import pytest

from kbpc.toolchain.assets import KERNELS_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, nvcc_path
from kbpc.codegen.emit import _env
from kbpc.codegen.families import dsa_indexer as lower_dsa
from kbpc.codegen.families import glm_mla_decode as lower_mla

pytestmark = pytest.mark.nvcc


def test_dsa_instances_compile_without_spills(tmp_path):
    insts = [lower_dsa.select_instance(32, 128, 4, 512, fp8) for fp8 in (False, True)]
    insts += [lower_dsa.select_instance(h, d, 4, topk, True, qrot=True)   # the fast form, D = 128, 64, 32
              for h, d, topk in ((32, 128, 512), (1, 128, 16), (48, 64, 64), (128, 32, 512))]
    insts += [lower_dsa.select_instance(h, d, 4, topk, False, mma=True)   # the tensor-core form
              for h, d, topk in ((32, 128, 512), (1, 128, 16), (7, 32, 3), (48, 64, 64), (128, 128, 512))]
    insts += [lower_dsa.select_instance(32, 128, 4, 512, False, mma=True, order_free=True),   # what fast mode lowers
              lower_dsa.select_instance(32, 128, 4, 512, True, qrot=True, order_free=True)]
    insts += [lower_dsa.store_instance(128, 4, fp8) for fp8 in (False, True)]
    insts += [lower_dsa.store_instance(d, 4, fp8, norm=True)   # rule dsa_key_store; the GPU test's widths
              for d, fp8 in ((128, False), (128, True), (64, True), (32, False), (256, True))]
    insts += [lower_dsa.select_instance(4, 128, 4, 4, False), lower_mla.decode_instance(512, 4),
              lower_mla.decode_instance(512, 2)]
    insts += [lower_mla.fast_instance(512, hpc) for hpc in (4, 2, 1)]   # numerics fast, 4, 2, 1 heads per CTA
    template = _env().get_template("kernel_instance.cu.j2")
    src = tmp_path / "dsa.cu"
    src.write_text("\n".join(template.render(inst=i) for i in insts))
    cmd = [nvcc_path(), *BASE_FLAGS, "-gencode=arch=compute_90a,code=sm_90a", "-c", f"-I{KERNELS_DIR}",
           "-Xptxas", "-v", str(src), "-o", str(tmp_path / "dsa.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert len(spills) == len(insts) and all(s == ("0", "0") for s in spills), proc.stderr[-3000:]


@pytest.mark.parametrize("h,d,fp8,mma", [(32, 128, False, False), (60, 128, False, False), (32, 128, True, False),
                                         (128, 64, True, False), (32, 128, False, True), (128, 128, False, True),
                                         (7, 32, False, True)])
def test_select_shared_memory_model_is_what_ptxas_reports(tmp_path, h, d, fp8, mma):
    """check_select_sizes rejects a head count and width by lower_dsa.select_smem_bytes (a lowering
    error instead of the kernel's static_assert in nvcc), so the model must be the kernel's size; the
    largest f32 CUDA-core form at width 128 (60 heads) fits the 48 KB limit."""
    inst = lower_dsa.select_instance(h, d, 4, 16, fp8, mma=mma)
    lower_dsa.check_select_sizes(h, d, 16, fp8, mma=mma)
    src = tmp_path / "sel.cu"
    src.write_text(_env().get_template("kernel_instance.cu.j2").render(inst=inst))
    cmd = [nvcc_path(), *BASE_FLAGS, "-gencode=arch=compute_90a,code=sm_90a", "-c", f"-I{KERNELS_DIR}",
           "-Xptxas", "-v", str(src), "-o", str(tmp_path / "sel.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (smem,) = re.findall(r"(\d+) bytes smem", proc.stderr)
    assert int(smem) == lower_dsa.select_smem_bytes(h, d, fp8, mma)
