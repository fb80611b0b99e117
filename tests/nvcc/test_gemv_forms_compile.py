"""The fast and small-N GEMV forms (the fast shared-expert pair too), and the fused router GEMV +
top-k (router_gemv_topk, and router_gemv_topk_quant, which also quantizes the experts' input, as
the lowering instantiates them), instantiate at the seed's shapes and at
odd legal shapes, for sm_90a (the real build flags; no register spills) and sm_121a (compile only,
-O1)."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest

from kbpc.codegen.families.glm_router_topk import fused_instance, fused_quant_instance
from kbpc.codegen.families.w4a16_gemv import pair_instance, pair_shapes
from kbpc.toolchain.nvcc import BASE_FLAGS, KERNELS_DIR, nvcc_path

pytestmark = pytest.mark.nvcc

BF = "__nv_bfloat16"
W4 = f"const uint8_t*, const uint8_t*, float, const {BF}*, {BF}*, int"
WX = "const uint8_t*, const float*, const uint8_t*, const float*, __nv_bfloat16*, int, float*, unsigned*"
SOURCE = f"""#include <cuda_bf16.h>
#include "w4a16_mma.cuh"
#include "wxay.cuh"
#include "dense_bf16.cuh"
#include "glm_router_topk.cuh"
template __global__ void kbp::w4a16_mma<4096, 4, 2>({W4});
template __global__ void kbp::w4a16_mma<8192, 8, 1>({W4});
template __global__ void kbp::w4a16_mma<1056, 1, 8>({W4});
template __global__ void kbp::w4a16_mma<32, 1, 1>({W4});
template __global__ void kbp::w4a16_mma<20480, 16, 1>({W4});
template __global__ void kbp::w4a16_mma_seg_list<4096, 2, 4, 6>(const __grid_constant__ kbp::W4A16SegList<6>, const {BF}*);
template __global__ void kbp::w4a16_mma_f32_input<2048, 8, 1>(const uint8_t*, const uint8_t*, float, const float*, {BF}*, int);
template __global__ void kbp::w4a16_mma_f32_input<10240, 16, 1>(const uint8_t*, const uint8_t*, float, const float*, {BF}*, int);
template __global__ void kbp::w4a16_gemv<8192>({W4});
template __global__ void kbp::w4a16_gemv<1040>({W4});
template __global__ void kbp::wxay_rowscale_ks<4096, 1>({WX});
template __global__ void kbp::wxay_rowscale_ks<2176, 4>({WX});
template __global__ void kbp::wxay_rowscale_split_ks<4096, 2, 2>(const __grid_constant__ kbp::WxaySegList<2>, const uint8_t*, const float*, float*, unsigned*);
template __global__ void kbp::dense_gemv_bf16_opc<4096, float, 1>(const {BF}*, const {BF}*, float*, int);
template __global__ void kbp::dense_gemv_bf16_opc<520, {BF}, 2>(const {BF}*, const {BF}*, {BF}*, int);
"""
# (hidden, experts, top k): the seed, its 128-expert shrink, the tiny example, a row past the GEMV's
# first load batch, the top-k's limits, odd sizes.
ROUTERS = [(4096, 288, 8), (4096, 128, 8), (256, 8, 2), (6144, 256, 8), (1024, 1024, 32), (104, 33, 4), (512, 700, 8)]
# The quantizing form needs whole NVFP4 groups (hidden % 16): the same, with a 208-wide odd row.
QUANT_ROUTERS = [r for r in ROUTERS if r[0] % 16 == 0] + [(208, 33, 4)]
# (k, i, n) of fast shared-expert pairs as the lowering shapes them: the seed's, a 512-thread phase,
# the largest K and I (static shared memory: one staging buffer for both phases, I's row split in
# hi and lo parts: W4A16F_SPLIT_MAX_K).
PAIRS = [(4096, 2048, 4096), (2176, 96, 37), (8192, 1024, 520), (20480, 10240, 4096)]
SOURCE += "".join(f"template __global__ void {i.kernel}({', '.join(i.params)});\n"
                  for i in [fused_instance(*r) for r in ROUTERS] + [fused_quant_instance(*r) for r in QUANT_ROUTERS] +
                  [pair_instance(k, i, pair_shapes(k, i, n)) for k, i, n in PAIRS])


@pytest.mark.parametrize("arch", ["sm_90a", "sm_121a"])
def test_forms_compile(arch):
    flags = BASE_FLAGS if arch == "sm_90a" else tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "forms.cu"
        src.write_text(SOURCE)
        cmd = [nvcc_path(), *flags, f"-gencode=arch=compute_{arch[3:]},code={arch}", "-cubin", "-Xptxas", "-v",
               f"-I{KERNELS_DIR}", str(src), "-o", str(src) + ".cubin"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-3000:]}"
    if arch == "sm_90a":
        spills = [int(m) for m in re.findall(r"(\d+) bytes spill stores", proc.stderr)]
        assert spills and max(spills) == 0, "register spills:\n" + proc.stderr[-3000:]
