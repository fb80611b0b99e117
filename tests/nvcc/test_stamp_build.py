"""A profiling build's kernels compile (`kbpc compile --stamps`, kernels/kbp_stamps.cuh): every kernel
instance TU of the tiny blueprint, both numerics modes, whose kernel header carries stamps, is
compiled as the stamp build renders it (KBP_STAMPS defined, the log exported), and the step program
that lists the logs compiles against their declarations. A product build's TUs do not define
KBP_STAMPS, so their machine code is the unstamped kernels' (the macros expand to nothing:
tests/unit/test_stamp_phases.py). -O1 keeps CI fast; the instances are the real ones."""
from __future__ import annotations

import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kbpc.codegen.emit import generate
from kbpc.frontend.load import load_blueprint
from kbpc.ir.plan import Options
from kbpc.passes import run_pipeline
from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, nvcc_path

pytestmark = pytest.mark.nvcc

FLAGS = tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS) + ("-gencode=arch=compute_90a,code=sm_90a",)


def _stamped(header: str) -> bool:
    return "KBP_STAMP_BEGIN()" in (KERNELS_DIR / header).read_text()


def _compile(path: Path) -> str | None:
    cmd = [nvcc_path(), *FLAGS, "-c", f"-I{KERNELS_DIR}", f"-I{RUNTIME_STUB_DIR}", str(path), "-o", f"{path}.o"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return f"{shlex.join(cmd)}\n{proc.stderr.strip()[-3000:]}" if proc.returncode else None


def test_stamp_build_compiles(tiny_path, tmp_path):
    paths = []
    for numerics in ("fast", "exact"):
        plan = run_pipeline(load_blueprint(Path(tiny_path)), Options(numerics=numerics))
        sources = generate(plan, "x", stamps=True)
        for inst in sources.step.instances:
            if _stamped(inst.header):
                path = tmp_path / numerics / f"{inst.name}.cu"
                path.parent.mkdir(exist_ok=True)
                path.write_text(sources.files[f"src/kernels/{inst.name}.cu"])
                paths.append(path)
        step = tmp_path / numerics / "step.cu"
        step.parent.mkdir(exist_ok=True)
        step.write_text(sources.files["src/step.cu"])
        paths.append(step)
    assert len(paths) > 2 * 5, "the tiny step has instrumented kernels in both modes"
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        errors = [e for e in pool.map(_compile, paths) if e]
    assert not errors, "\n\n".join(errors)
