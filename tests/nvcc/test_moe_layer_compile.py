"""The fused MoE layer kernels (kernels/glm_moe_layer.cuh) build at planned shapes: the seed's, the
tiny example's (K split in 2) and one without a shared expert split in 8; the header's shared-memory
formula equals the planner's (a static_assert per kernel: the launch passes the planner's bytes);
sm_90a keeps them spill-free within 128 registers (two 256-thread CTAs per SM). sm_121a must
compile too (-O1, seed shapes)."""
from __future__ import annotations

import re
import subprocess

import pytest

from kbpc.build.nvcc import BASE_FLAGS, KERNELS_DIR, nvcc_path
from kbpc.codegen.families.glm_moe_layer import MoeLayerShape, gate_up_plan, plan_moe_layer
from kbpc.testing.moe_layer import source

pytestmark = pytest.mark.nvcc

SHAPES = {
    "seed": MoeLayerShape(4096, 2048, 2048, 288, 8),
    "tiny": MoeLayerShape(256, 128, 128, 8, 2),
    "noshared": MoeLayerShape(1152, 256, 0, 40, 8),
}


def _kernels(names, sms=132):
    kernels = {}
    for name in names:
        gu, dn = plan_moe_layer(SHAPES[name], sms)
        if name == "noshared":
            gu = gate_up_plan(SHAPES[name], 8, 2, gu.grid)
        kernels[f"gu_{name}"], kernels[f"dn_{name}"] = gu, dn
    return kernels


def _asserts(kernels) -> str:
    lines = []
    for plan in kernels.values():
        fn = plan.kernel.replace("moe_gate_up<", "moe_gate_up_smem<").replace("moe_down<", "moe_down_smem<")
        lines.append(f'static_assert({fn}() == {plan.smem}, "planner smem for {plan.kernel}");')
    return "\n".join(lines) + "\n"


def _compile(tmp_path, gencode, flags, kernels, tag):
    src = tmp_path / f"moe_{tag}.cu"
    src.write_text(source(kernels) + _asserts(kernels))
    cmd = [nvcc_path(), *flags, gencode, "-cubin", "-Xptxas", "-v", f"-I{KERNELS_DIR}", str(src), "-o",
           str(src) + ".cubin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
    return proc.stderr


def test_moe_layer_builds_sm90(tmp_path):
    kernels = _kernels(SHAPES)
    log = _compile(tmp_path, "-gencode=arch=compute_90a,code=sm_90a", BASE_FLAGS, kernels, "sm90")
    props = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
                       r"(\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers", log)
    assert {p[0] for p in props} == set(kernels), log
    for name, stack, spill_st, spill_ld, regs in props:
        assert (int(stack), int(spill_st), int(spill_ld)) == (0, 0, 0), f"{name} spills:\n{log}"
        assert int(regs) <= 128, f"{name} uses {regs} registers (two 256-thread CTAs per SM need <= 128)"


def test_moe_layer_builds_sm121(tmp_path):
    flags = tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS)
    _compile(tmp_path, "-gencode=arch=compute_121a,code=sm_121a", flags, _kernels(["seed"]), "sm121")
