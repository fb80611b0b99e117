"""The fused MoE layer kernel (kernels/glm_moe_layer.cuh, kbp::moe_layer) builds as the product's
instance TU at planned shapes: the seed's, the tiny example's (gate_up K split in 2) and one without
a shared expert split in 8; the header's shared-memory formula equals the planner's (a
static_assert per phase: the launch passes the planner's bytes); sm_90a keeps it spill-free within
128 registers (two 256-thread CTAs per SM). sm_121a must compile too (-O1, seed shapes)."""
from __future__ import annotations

import re
import subprocess

import pytest

from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, nvcc_path
from kbpc.codegen.families.glm_moe_layer import MoeLayerPlan, MoeLayerShape, phase_plan, plan_moe_layer
from kbpc.testing.launchers import render_instance

pytestmark = pytest.mark.nvcc

SHAPES = {
    "seed": MoeLayerShape(4096, 2048, 2048, 288, 8),
    "tiny": MoeLayerShape(256, 128, 128, 8, 2),
    "noshared": MoeLayerShape(1152, 256, 0, 40, 8),
}


def _plans(names, sms=132) -> list[MoeLayerPlan]:
    plans = []
    for name in names:
        plan = plan_moe_layer(SHAPES[name], sms)
        if name == "noshared":
            plan = MoeLayerPlan(plan.shape, phase_plan(plan.shape, 0, 8, 2, plan.gate_up.grid), plan.down)
        plans.append(plan)
    return plans


def _source(plans: list[MoeLayerPlan]) -> str:
    """Each plan's instance TU as the product renders it, and static_asserts of the planner's smem."""
    out = []
    for i, plan in enumerate(plans):
        s, g, d = plan.shape, plan.gate_up, plan.down
        common = f"{s.hidden}, {s.inter}, {s.shared_inter}"
        gu = f"kbp::moe_gate_up_smem<{common}, {s.experts}, {s.top_k}, {s.tokens}, {g.parts}, {g.stages}>()"
        dn = f"kbp::moe_down_smem<{common}, {s.top_k}, {s.tokens}, {d.parts}, {d.stages}>()"
        out.append(render_instance(plan.instance()).replace("kbp_test_", f"kbp_test{i}_"))
        out.append(f'static_assert({gu} == {g.smem}, "planner smem, phase 0 of {plan.kernel}");\n'
                   f'static_assert({dn} == {d.smem}, "planner smem, phase 1 of {plan.kernel}");\n')
    return "".join(out)


def _compile(tmp_path, gencode, flags, plans, tag) -> str:
    src = tmp_path / f"moe_{tag}.cu"
    src.write_text(_source(plans))
    cmd = [nvcc_path(), *flags, gencode, "-cubin", "-Xptxas", "-v", f"-I{KERNELS_DIR}", f"-I{RUNTIME_STUB_DIR}",
           str(src), "-o", str(src) + ".cubin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
    return proc.stderr


def test_moe_layer_builds_sm90(tmp_path):
    plans = _plans(SHAPES)
    log = _compile(tmp_path, "-gencode=arch=compute_90a,code=sm_90a", BASE_FLAGS, plans, "sm90")
    props = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
                       r"(\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers", log)
    props = [p for p in props if "moe_layer" in p[0]]
    assert len(props) == len(plans), log
    for name, stack, spill_st, spill_ld, regs in props:
        assert (int(stack), int(spill_st), int(spill_ld)) == (0, 0, 0), f"{name} spills:\n{log}"
        assert int(regs) <= 128, f"{name} uses {regs} registers (two 256-thread CTAs per SM need <= 128)"


def test_moe_layer_builds_sm121(tmp_path):
    flags = tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS)
    _compile(tmp_path, "-gencode=arch=compute_121a,code=sm_121a", flags, _plans(["seed"]), "sm121")
