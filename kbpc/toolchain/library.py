"""Build the artifact's shared library: every generated TU and the runtime stub compiled in
parallel through a content-hash object cache, linked with nvcc and stripped.

The cache key of an object hashes its source text, every kernels/ and runtime_stub/ header, the
nvcc flags, the target and the nvcc version, so an unchanged instance is never rebuilt. nvcc puts
a process-id temp name into each object's symbol table; stripping the linked library removes it,
so the library is byte-identical from build to build."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import platformdirs

from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.toolchain.nccl import find_nccl
from kbpc.toolchain.nvcc import BASE_FLAGS, compile_cuda, nvcc_path, nvcc_version
from kbpc.errors import BuildError
from kbpc.targets import Target

TP_RUNTIME = "kbp_tp.cu"     # the NCCL half of the runtime: tensor-parallel libraries only


def runtime_sources(tensor_parallel: bool = False) -> dict[str, str]:
    """The hand-written runtime compiled into every artifact (with kbp_tp.cu when split)."""
    return {f"runtime_stub/{p.name}": p.read_text() for p in sorted(RUNTIME_STUB_DIR.glob("*.cu"))
            if tensor_parallel or p.name != TP_RUNTIME}


def default_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("kbpc")) / "build"


@dataclass(frozen=True)
class BuildResult:
    library: Path
    objects: tuple[Path, ...]
    compiled: int               # objects built now
    cached: int                 # objects taken from the cache
    flags: tuple[str, ...]
    nvcc: str


def _headers_digest() -> str:
    h = hashlib.sha256()
    for path in sorted([*KERNELS_DIR.glob("*.cuh"), *RUNTIME_STUB_DIR.glob("*.h")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_flags(target: Target) -> tuple[str, ...]:
    return (*BASE_FLAGS, *target.gencode, "-c", "-Xcompiler", "-fPIC")


def build_library(sources: dict[str, str], target: Target, out: Path, *, cache_dir: Path | None = None,
                  jobs: int | None = None, on_object: Callable[[str, bool], None] | None = None,
                  tensor_parallel: bool = False) -> BuildResult:
    """Compile `sources` (relative name -> CUDA text) plus the runtime stub and link them into
    `out`. `on_object(name, cached)` is called as each object is ready (progress display).
    tensor_parallel: the library of one rank, with the NCCL runtime and linked against NCCL."""
    cache = Path(cache_dir or default_cache_dir())
    (cache / "src").mkdir(parents=True, exist_ok=True)
    (cache / "obj").mkdir(parents=True, exist_ok=True)
    version = nvcc_version()
    nccl = find_nccl() if tensor_parallel else None
    nccl_key = (nccl.version, (nccl.include / "nccl.h").read_bytes()) if nccl else None
    common = hashlib.sha256(repr((_headers_digest(), build_flags(target), version, nccl_key)).encode()).hexdigest()
    includes = (nccl.include,) if nccl else ()
    units = dict(sources)
    units.update(runtime_sources(tensor_parallel))

    def one(item: tuple[str, str]) -> tuple[Path, bool]:
        name, text = item
        key = hashlib.sha256((common + "\0" + text).encode()).hexdigest()[:32]
        obj = cache / "obj" / f"{key}.o"
        if obj.exists():
            if on_object:
                on_object(name, True)
            return obj, True
        src = cache / "src" / f"{key}.cu"
        src.write_text(text)
        compile_cuda(src, obj, target, kind="obj", include_dirs=includes)
        if on_object:
            on_object(name, False)
        return obj, False

    workers = jobs or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, sorted(units.items())))
    objects = tuple(obj for obj, _ in results)
    _link(objects, out, target, nccl.link_flags if nccl else ())
    cached = sum(1 for _, hit in results if hit)
    return BuildResult(library=out, objects=objects, compiled=len(results) - cached, cached=cached,
                       flags=build_flags(target), nvcc=version)


def _link(objects: tuple[Path, ...], out: Path, target: Target, libs: tuple[str, ...] = ()) -> None:
    """Link (NCCL by its soname, no run path: the runner loads NCCL before the library)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    cmd = [nvcc_path(), *target.gencode, "-shared", "-Xcompiler", "-fPIC", *map(str, objects), *libs, "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"linking the artifact library failed\ncommand: {' '.join(cmd)}\n{proc.stderr.strip()}")
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-all", str(tmp)], check=True, capture_output=True)
    os.replace(tmp, out)
