"""A failed nvcc run reports the exact command, the source file and the compiler log, and leaves no
output behind."""
from __future__ import annotations

import pytest

from kbpc.toolchain.nvcc import compile_cuda
from kbpc.errors import BuildError
from kbpc.targets import get_target

pytestmark = pytest.mark.nvcc


def test_failed_compile_reports_command_source_and_log(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text("__global__ void k() { this_is_not_defined(); }\n")
    out = tmp_path / "broken.cubin"
    with pytest.raises(BuildError) as info:
        compile_cuda(src, out, get_target("sm_90"))
    text = str(info.value)
    assert "command:" in text and "nvcc" in text and str(src) in text
    assert "this_is_not_defined" in text
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["broken.cu"]
