"""The one place that runs nvcc. A failure raises BuildError with the exact command, the source
and the compiler log.

What nvcc builds holds no path of this machine, so the same sources and toolchain give the same
bytes in any checkout and any cache directory:
- nvcc runs in the source's folder and is given the source by its bare name;
- the front end (cudafe++) and the device compiler (cicc) name anonymous namespaces
  (`_GLOBAL__N__<hash of the source's absolute path>_<name>`) after `--orig_src_path_name`,
  which nvcc sets to the absolute path; it is set again, to the unit's own name (`name`), after
  nvcc's own (the last one wins, and both tools get the same value, so host stubs and device
  kernels still agree);
- `-ffile-prefix-map` turns the kernels/ and runtime_stub/ folders into those relative names
  wherever the preprocessor would spell a path (`__FILE__`);
- no `-lineinfo`: its line tables record the working directory and the CUDA include folders as
  absolute paths, and there is no prefix map for device line tables.
The temporary names nvcc gives its intermediate files stay in the objects' symbol tables, which
the library link strips. tests/nvcc/test_reproducible.py checks all of it with two checkouts."""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from kbpc.errors import BuildError
from kbpc.targets import Target
from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.toolchain.process import run_tool


# Numerics: no FMA contraction (the reference rounds every product and sum), no fast math.
# Safety: a constant that does not fit the parameter it is passed to (a size over 2**31 for an
# `int`) is an error, not a silently truncated kernel argument: the front end's EDG diagnostics
# 61 (integer operation result out of range), 63 (shift count too large), 68 (conversion changes
# sign) and 69 (conversion truncates) become errors, and so do the host compiler's overflow and
# narrowing warnings. No -lineinfo: device line tables record absolute source paths, which would
# make the library differ from machine to machine.
BASE_FLAGS = ("-std=c++17", "-O3", "--fmad=false", "--diag-error", "61,63,68,69",
              "-Xcompiler", "-Werror=overflow,-Werror=narrowing")


def nvcc_path() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise BuildError("nvcc not found on PATH; install the CUDA toolkit (13.0) or add its bin/ to PATH")
    return path


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().splitlines()[-1] if out.stdout else "unknown"


def _include_flags(extra: tuple[Path, ...]) -> list[str]:
    flags = []
    for folder in (KERNELS_DIR, RUNTIME_STUB_DIR):
        flags += [f"-I{folder}", "-Xcompiler", f"-ffile-prefix-map={folder}={folder.name}"]
    return flags + [f"-I{d}" for d in extra]


def _source_name_flags(name: str) -> list[str]:
    return ["-Xcudafe", f"--orig_src_path_name={name}", "-Xcicc", f"--orig_src_path_name={name}"]


def compile_cuda(source: Path, output: Path, target: Target, *, kind: str = "cubin",
                 include_dirs: tuple[Path, ...] = (), extra_flags: tuple[str, ...] = (),
                 name: str | None = None) -> list[str]:
    """Compile one .cu file to a cubin, an object file or a shared library; return the command.
    `name` (default: the file's name) is what the compiled code may say about where it came from
    (anonymous namespaces are named after it).

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
    source = Path(source).resolve()
    cmd = [nvcc_path(), *BASE_FLAGS, *target.gencode, *kind_flags[kind], *_include_flags(include_dirs),
           *_source_name_flags(name or source.name), *extra_flags, source.name, "-o", tmp]
    # nvcc's intermediate files go beside the source (a compile's private folder, swept if the
    # compile is killed) rather than into the shared temp folder
    proc = run_tool(cmd, cwd=source.parent, extra_env={"TMPDIR": str(source.parent)})
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise BuildError(
            f"nvcc failed (exit {proc.returncode}) on {source}\n"
            f"command: cd {shlex.quote(str(source.parent))} && {shlex.join(cmd)}\n"
            f"{proc.stderr.strip() or proc.stdout.strip()}")
    os.replace(tmp, output)
    return cmd
