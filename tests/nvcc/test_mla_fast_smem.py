"""The fast MLA decode's dynamic shared memory is sized twice: by the kernel
(mla_fast_smem_bytes in kernels/glm_mla_decode_fast.cuh, which lays the buffers out) and by the
lowering (kbpc.reference.glm_mla_decode_fast.FastSplit.smem_bytes, which the launch passes). A
launch given less than the kernel lays out would write past its allocation, so nvcc checks here,
at compile time, that the two agree for the seed's split and for small and odd ones."""
from __future__ import annotations

import shlex
import subprocess

import pytest

from kbpc.reference.glm_mla_decode_fast import FastSplit, fast_split
from kbpc.toolchain.assets import KERNELS_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, nvcc_path

pytestmark = pytest.mark.nvcc

SPLITS = [(512, fast_split(32, 2052, 1, 132, 512)),   # the seed: 4 heads x 16 slices, 129 entries a chunk
          (512, FastSplit(1, 1, 1)), (1024, FastSplit(2, 7, 33)), (512, FastSplit(4, 132, 256))]


def test_lowered_shared_memory_is_what_the_kernel_lays_out(tmp_path):
    checks = "".join(f"static_assert(kbp::mla_fast_smem_bytes({e}, {s.hpc}, {s.chunk}, {s.slices}) == "
                     f"{s.smem_bytes(e)}u, \"E={e} {s}\");\n" for e, s in SPLITS)
    src = tmp_path / "smem.cu"
    src.write_text('#include "glm_mla_decode_fast.cuh"\n' + checks)
    cmd = [nvcc_path(), *BASE_FLAGS, "-gencode=arch=compute_90a,code=sm_90a", "-c", f"-I{KERNELS_DIR}", str(src),
           "-o", str(tmp_path / "smem.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr.strip()[-3000:]}"
