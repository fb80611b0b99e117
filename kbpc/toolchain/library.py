"""Build the artifact's shared library: every generated TU and the runtime stub compiled in
parallel through the object cache (kbpc/toolchain/cache.py), linked with nvcc and stripped.

An object's cache key hashes its source text, every kernels/ and runtime_stub/ header, the nvcc
flags (the target's code generation among them) and the nvcc version, so an unchanged instance is
never rebuilt and a changed header, flag or compiler never reuses a stale object. nvcc puts a
process-id temp name into each object's symbol table; stripping the linked library removes it,
so the library is byte-identical from build to build (kbpc/toolchain/nvcc.py keeps paths out)."""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from kbpc.errors import BuildError
from kbpc.targets import Target
from kbpc.toolchain.assets import KERNELS_DIR, RUNTIME_STUB_DIR
from kbpc.toolchain.cache import ObjectCache
from kbpc.util.nccl import find_nccl
from kbpc.toolchain.nvcc import BASE_FLAGS, compile_cuda, nvcc_path, nvcc_version
from kbpc.toolchain.process import end_all, run_tool

# Bump when what goes into an object changes in a way the key's other parts do not show.
OBJECT_FORMAT = "kbpc-object/3"
LIBRARY_NAME = "libkbp.so"


TP_RUNTIME = "kbp_tp.cu"     # the NCCL half of the runtime: tensor-parallel libraries only


def runtime_sources(tensor_parallel: bool = False) -> dict[str, str]:
    """The hand-written runtime compiled into every artifact (with kbp_tp.cu when split)."""
    return {f"runtime_stub/{p.name}": p.read_text() for p in sorted(RUNTIME_STUB_DIR.glob("*.cu"))
            if tensor_parallel or p.name != TP_RUNTIME}


class BuildEvents:
    """What a compile tells its caller as it goes (for progress displays); these do nothing."""

    def stage(self, name: str) -> None:
        """A stage starts: front end, passes, code generation, nvcc, bundle."""

    def objects(self, total: int) -> None:
        """The nvcc stage has `total` objects to provide."""

    def object_done(self, name: str, cached: bool) -> None:
        """One object is ready (compiled now, or taken from the cache)."""


@dataclass(frozen=True)
class UnitBuild:
    name: str           # the unit's relative source path (src/kernels/<instance>.cu, runtime_stub/...)
    key: str            # its object cache key
    cached: bool        # taken from the cache (else compiled now)
    seconds: float


@dataclass(frozen=True)
class BuildResult:
    library: Path
    units: tuple[UnitBuild, ...]
    flags: tuple[str, ...]
    nvcc: str

    @property
    def compiled(self) -> int:
        return sum(1 for u in self.units if not u.cached)

    @property
    def cached(self) -> int:
        return sum(1 for u in self.units if u.cached)


def _headers_digest() -> str:
    h = hashlib.sha256()
    for path in sorted([*KERNELS_DIR.glob("*.cuh"), *RUNTIME_STUB_DIR.glob("*.h")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def build_flags(target: Target) -> tuple[str, ...]:
    return (*BASE_FLAGS, *target.gencode, "-c", "-Xcompiler", "-fPIC")


def object_keys(units: dict[str, str], target: Target, nccl_key=None) -> dict[str, str]:
    """Unit name -> cache key (name and source text, headers, flags, target, nvcc version, and the
    NCCL header for a tensor-parallel build). The name is part of it because the object depends on
    it (see compile_cuda)."""
    common = hashlib.sha256(repr((OBJECT_FORMAT, _headers_digest(), build_flags(target), nvcc_version(), nccl_key))
                            .encode()).hexdigest()
    return {name: hashlib.sha256(f"{common}\0{name}\0{text}".encode()).hexdigest()[:32]
            for name, text in units.items()}


def build_library(sources: dict[str, str], target: Target, work: Path, cache: ObjectCache, *,
                  jobs: int | None = None, events: BuildEvents = BuildEvents(),
                  tensor_parallel: bool = False) -> BuildResult:
    """Compile `sources` (relative name -> CUDA text) plus the runtime stub in the private folder
    `work`, through `cache`, and link them into `work`/libkbp.so. tensor_parallel: the library of
    one rank, with the NCCL half of the runtime, linked against NCCL by its soname."""
    nccl = find_nccl() if tensor_parallel else None
    nccl_key = (nccl.version, (nccl.include / "nccl.h").read_bytes()) if nccl else None
    includes = (nccl.include,) if nccl else ()
    units = {**sources, **runtime_sources(tensor_parallel)}
    keys = object_keys(units, target, nccl_key)
    events.objects(len(units))

    def one(name: str) -> UnitBuild:
        t0 = time.perf_counter()
        obj = work / f"{keys[name]}.o"
        data = cache.load(keys[name])
        if data is not None:
            obj.write_bytes(data)
        else:
            src = work / f"{keys[name]}.cu"
            src.write_text(units[name])
            compile_cuda(src, obj, target, kind="obj", name=name, include_dirs=includes)
            cache.store(keys[name], obj.read_bytes())
        events.object_done(name, data is not None)
        return UnitBuild(name, keys[name], data is not None, time.perf_counter() - t0)

    workers = jobs or max(1, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        futures = [pool.submit(one, name) for name in sorted(units)]
        wait(futures, return_when=FIRST_EXCEPTION)
        built = tuple(f.result() for f in futures)
    except BaseException:   # a failed unit, Ctrl-C, SIGTERM: end the other nvcc jobs now
        pool.shutdown(wait=False, cancel_futures=True)
        end_all()
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    library = work / LIBRARY_NAME
    _link(tuple(work / f"{u.key}.o" for u in built), library, target, nccl.link_flags if nccl else ())
    return BuildResult(library=library, units=built, flags=build_flags(target), nvcc=nvcc_version())


def link_command(objects: tuple[Path, ...], out: Path, target: Target, libs: tuple[str, ...] = ()) -> list[str]:
    # -nodlink: no object is built with -rdc, so there is nothing to device-link, and nvlink would
    # embed its command line (with the CUDA installation's library paths) in the library.
    # --no-undefined: a library with an unresolved symbol (a damaged or missing object) is an error
    # here, not when a user loads it.
    return [nvcc_path(), *target.gencode, "-shared", "-nodlink", "-Xcompiler", "-fPIC", "-Xlinker",
            "--no-undefined", *map(str, objects), *libs, "-o", str(out)]


def _link(objects: tuple[Path, ...], out: Path, target: Target, libs: tuple[str, ...] = ()) -> None:
    """Link (NCCL, when given, by its soname with no run path: the runner loads NCCL first)."""
    tmp = out.with_name(f".{out.name}.tmp")
    cmd = link_command(objects, tmp, target, libs)
    proc = run_tool(cmd, cwd=out.parent)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"linking the artifact library failed\ncommand: {' '.join(cmd)}\n{proc.stderr.strip()}")
    strip = shutil.which("strip")
    if strip is None:  # without it the library keeps nvcc's temp names and is not reproducible
        tmp.unlink(missing_ok=True)
        raise BuildError("strip (GNU binutils) not found on PATH; it is needed to build a library")
    proc = run_tool([strip, "--strip-all", str(tmp)])
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"strip failed on the artifact library: {proc.stderr.strip()}")
    os.replace(tmp, out)
