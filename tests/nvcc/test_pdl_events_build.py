"""The PDL-across-events graph check (kbpc/testing/pdl_events.py, run by
tests/gpu/test_gpu_pdl_events.py) builds: its kernels through the product's launcher template and
its capture harness compile for sm_90 (no GPU needed)."""
from __future__ import annotations

import subprocess

import pytest

from kbpc.testing.pdl_events import FIRST, READER, WRITER, build

pytestmark = pytest.mark.nvcc


def test_pdl_events_library_builds(tmp_path):
    lib = build(tmp_path / "pdl_events")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
    assert "kbp_pdl_events_run" in symbols
    for inst in (WRITER, FIRST, READER):
        assert f"kbp_launch_{inst.name}" in symbols
