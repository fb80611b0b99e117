"""Where NCCL is on this machine: its header and its shared library, for tensor-parallel builds
(a tp = 1 library never includes or links it) and for the runner, which loads the same library
before a rank's artifact so the artifact's `libnccl.so.2` dependency resolves to it.

Looked for in order: `KBPC_NCCL_HOME` (a folder with include/nccl.h and lib/libnccl.so*, read by
kbpc.settings), the `nvidia-nccl-cu13` / `-cu12` Python packages (`nvidia/nccl/`), the CUDA
toolkit next to nvcc, and the system folders. NCCL 2.27 or newer is needed (symmetric memory
windows); the build checks the header's version."""
from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from kbpc.errors import BuildError
from kbpc.settings import nccl_home

MIN_VERSION = (2, 27)
SYSTEM = (Path("/usr"), Path("/usr/local"), Path("/usr/local/cuda"), Path("/opt/nccl"))
LIB_DIRS = ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib/sbsa-linux-gnu")


@dataclass(frozen=True)
class Nccl:
    include: Path           # folder holding nccl.h
    library: Path           # libnccl.so.2 (or libnccl.so)
    version: tuple[int, int, int]

    @property
    def link_flags(self) -> tuple[str, ...]:
        return (f"-L{self.library.parent}", f"-l:{self.library.name}")


def _candidates() -> list[Path]:
    roots = []
    home = nccl_home()
    if home:
        roots.append(Path(home))
    for pkg in ("nvidia.nccl",):
        try:
            spec = importlib.util.find_spec(pkg)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            roots += [Path(p) for p in spec.submodule_search_locations]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    return roots + list(SYSTEM)


def _library(root: Path) -> Path | None:
    for sub in LIB_DIRS:
        for name in ("libnccl.so.2", "libnccl.so"):
            if (root / sub / name).exists():
                return root / sub / name
    return None


def header_version(header: Path) -> tuple[int, int, int]:
    text = header.read_text(errors="replace")
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise BuildError(f"{header} does not state its NCCL version")
    return tuple(int(p.group(1)) for p in parts)


def find_nccl() -> Nccl:
    tried = []
    for root in _candidates():
        header = root / "include" / "nccl.h"
        lib = _library(root)
        tried.append(str(root))
        if header.exists() and lib is not None:
            version = header_version(header)
            if version[:2] < MIN_VERSION:
                raise BuildError(f"NCCL {'.'.join(map(str, version))} at {root} is older than "
                                 f"{'.'.join(map(str, MIN_VERSION))} (symmetric memory windows)")
            return Nccl(header.parent, lib, version)
    raise BuildError("a tensor-parallel build needs NCCL (nccl.h and libnccl.so.2) and found none in "
                     f"{', '.join(tried)}; pip install nvidia-nccl-cu13, or set KBPC_NCCL_HOME")
