"""The GPU tests' launcher harness compiles: a kernel instance from the product's lowering, rendered
through the product's launcher template plus the test shim, builds into a shared library that
exports the shim and the parameter sizes (no GPU needed)."""
from __future__ import annotations

import subprocess

import pytest

from kbpc.toolchain.nvcc import compile_cuda
from kbpc.codegen.families import layer_norm as lower_ln
from kbpc.targets import get_target
from kbpc.testing.launchers import render_instance
from kbpc.testing.lowering import family_groups, planned

pytestmark = pytest.mark.nvcc


def test_launcher_library_builds(tiny_path, tmp_path):
    plan, ctx = planned(str(tiny_path))
    (launch,) = lower_ln.lower(ctx, family_groups(plan, "layer_norm")[0])
    src = tmp_path / "launch.cu"
    src.write_text(render_instance(launch.instance))
    lib = tmp_path / "launch.so"
    compile_cuda(src, lib, get_target("sm_90"), kind="shared")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert "kbp_test_launch" in symbols and "kbp_test_param_bytes" in symbols
    assert f"kbp_launch_{launch.instance.name}" in symbols
