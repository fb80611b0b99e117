"""The one place that runs nvcc. A failure raises BuildError with the exact command, the source
and the compiler log."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from kbpc.errors import BuildError
from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.targets import Target


# Numerics: no FMA contraction (the reference rounds every product and sum), no fast math.
BASE_FLAGS = ("-std=c++17", "-O3", "--fmad=false", "-lineinfo")


def nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise BuildError("nvcc not found on PATH; install the CUDA toolkit (13.0) or add its bin/ to PATH")
    return path


def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[-1] if out.stdout else "unknown"


def compile_cuda(source: Path, output: Path, target: Target, *, kind: str = "cubin",
                 include_dirs: tuple[Path, ...] = (), extra_flags: tuple[str, ...] = ()) -> list[str]:
    """Compile one .cu file to a cubin, an object file or a shared library; return the command.

    The output is written to a temporary name and renamed, so a failed build leaves nothing."""
    kind_flags = {"cubin": ("-cubin",), "obj": ("-c", "-Xcompiler", "-fPIC"),
                  "shared": ("-shared", "-Xcompiler", "-fPIC")}
    if kind not in kind_flags:
        raise ValueError(f"unknown output kind {kind!r}")
    if kind == "cubin" and len(target.gencode) != 1:
        raise ValueError("a cubin holds one architecture")
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=output.name + ".", dir=output.parent)
    os.close(fd)
    includes = [f"-I{d}" for d in (KERNELS_DIR, RUNTIME_STUB_DIR, *include_dirs)]
    cmd = [nvcc_path(), *BASE_FLAGS, *target.gencode, *kind_flags[kind], *includes, *extra_flags,
           str(source), "-o", tmp]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(
            f"nvcc failed (exit {proc.returncode}) on {source}\ncommand: {shlex.join(cmd)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}")
    os.replace(tmp, output)
    return cmd
