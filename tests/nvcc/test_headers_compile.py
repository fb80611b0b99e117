"""Every kernels/*.cuh compiles on its own (a file that only includes it) for sm_90a and sm_121a.

sm_90a uses the real build flags (kbpc.toolchain.nvcc.BASE_FLAGS); sm_121a only has to compile, so it
runs at -O1 to keep CI (2 cores) fast. Compilations run in parallel, two at a time.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kbpc.toolchain.assets import KERNELS_DIR
from kbpc.toolchain.nvcc import BASE_FLAGS, nvcc_path

pytestmark = pytest.mark.nvcc

ARCHS = {
    "sm_90": ("-gencode=arch=compute_90a,code=sm_90a", BASE_FLAGS),
    "sm_121": ("-gencode=arch=compute_121a,code=sm_121a",
               tuple("-O1" if f == "-O3" else f for f in BASE_FLAGS)),
}
HEADERS = sorted(KERNELS_DIR.glob("*.cuh"))


def _compile(header: Path, arch: str, workdir: Path) -> str | None:
    gencode, flags = ARCHS[arch]
    src = workdir / f"{header.stem}.{arch}.cu"
    src.write_text(f'#include "{header.name}"\n')
    cmd = [nvcc_path(), *flags, gencode, "-cubin", f"-I{KERNELS_DIR}", str(src), "-o", str(src) + ".cubin"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        return f"{header.name} [{arch}]: {shlex.join(cmd)}\n{proc.stderr.strip()[-3000:]}"
    return None


def test_every_header_compiles_alone():
    assert HEADERS, f"no headers under {KERNELS_DIR}"
    jobs = [(h, a) for h in HEADERS for a in ARCHS]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        errors = [e for e in pool.map(lambda j: _compile(j[0], j[1], Path(tmp)), jobs) if e]
    assert not errors, "\n\n".join(errors)


def test_all_headers_compile_together(tmp_path):
    """The step program includes every header one kernel instance needs, so two headers may meet in
    one translation unit: no helper may be defined in two of them (one home: kbp_common.cuh)."""
    gencode, flags = ARCHS["sm_90"]
    src = tmp_path / "all.cu"
    src.write_text("".join(f'#include "{h.name}"\n' for h in HEADERS))
    cmd = [nvcc_path(), *flags, gencode, "-c", f"-I{KERNELS_DIR}", str(src), "-o", str(tmp_path / "all.o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stderr.strip()[-3000:]}"
