"""The one module that reads the process environment: environment variables, and whether a person
is at a terminal. Everything else asks here.

  KBPC_SIGNING_KEY             the signing key for `compile` / `sign` when --key is not given: a
                               private key file's path, or the key file's PEM text itself (what a
                               CI secret usually holds)
  KBPC_SIGNING_KEY_PASSPHRASE  the passphrase of an encrypted private key (PEM), and the one
                               `kbpc keygen --encrypt` encrypts a new key with
  CI                           set (to anything but "", "0" or "false") by CI services: kbpc then
                               never creates a signing key on its own
  KBPC_CACHE_DIR               root of kbpc's caches (objects in build/, compiled-on-run bundles
                               in run/); default: the user cache folder (platformdirs)
  KBPC_CACHE_LIMIT             size limit of the object cache, e.g. 2G or 500M (default 5G); the
                               least recently used objects are evicted past it
  KBPC_TRACEBACK               1: an internal error prints its Python traceback
  KBPC_TEST_CUBIN_CACHE        where the GPU test harness caches compiled test kernels
  KBPC_NCCL_HOME               a folder with include/nccl.h and lib/libnccl.so.2 (tensor parallelism)
  OMPI_COMM_WORLD_RANK, ...    rank and size of a process an MPI launcher started
  CUDA_VISIBLE_DEVICES, NCCL_NVLS_ENABLE   set for the rank processes the launcher starts
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kbpc.errors import KbpcError

SIGNING_KEY_ENV = "KBPC_SIGNING_KEY"
PASSPHRASE_ENV = "KBPC_SIGNING_KEY_PASSPHRASE"


def signing_key_from_env() -> str | None:
    value = os.environ.get(SIGNING_KEY_ENV, "")
    return value if value.strip() else None


def key_passphrase() -> bytes | None:
    value = os.environ.get(PASSPHRASE_ENV)
    return value.encode("utf-8") if value else None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def interactive() -> bool:
    """A person at a terminal (stdin is a TTY) and not a CI job."""
    try:
        return sys.stdin is not None and sys.stdin.isatty() and not in_ci()
    except (ValueError, OSError):   # a closed or detached stdin
        return False


def gpu_test_cubin_cache() -> Path:
    return (environment().test_cubin_cache or Path(tempfile.gettempdir())) / "kbpc-test-cubins"


DEFAULT_CACHE_LIMIT = 5 << 30
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, where: str) -> int:
    """'5G', '500M', '123456' (bytes) -> bytes; a KbpcError naming `where` otherwise."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise KbpcError(f"expected a size such as 2G, 500M or a number of bytes, got {text[:40]!r}", where)
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class Environment:
    cache_dir: Path | None
    cache_limit: int
    traceback: bool
    test_cubin_cache: Path | None


def _path(name: str) -> Path | None:
    value = os.environ.get(name, "")
    return Path(value).expanduser() if value else None


def environment() -> Environment:
    """The environment as kbpc reads it now (read on each call, so tests may change it)."""
    limit = os.environ.get("KBPC_CACHE_LIMIT", "")
    return Environment(
        cache_dir=_path("KBPC_CACHE_DIR"),
        cache_limit=parse_size(limit, "KBPC_CACHE_LIMIT") if limit else DEFAULT_CACHE_LIMIT,
        traceback=os.environ.get("KBPC_TRACEBACK", "") not in ("", "0"),
        test_cubin_cache=_path("KBPC_TEST_CUBIN_CACHE"),
    )


# Rank and size as MPI launchers (Open MPI, MPICH/PMI, Slurm) export them to each process.
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def nccl_home() -> str | None:
    """KBPC_NCCL_HOME: a folder with include/nccl.h and lib/libnccl.so.2 (kbpc.util.nccl)."""
    return os.environ.get("KBPC_NCCL_HOME") or None


def mpi_rank_size() -> tuple[int, int] | None:
    """(rank, size) when this process was started by an MPI launcher, else None."""
    rank = next((os.environ[v] for v in MPI_RANK_VARS if v in os.environ), None)
    size = next((os.environ[v] for v in MPI_SIZE_VARS if v in os.environ), None)
    if rank is None or size is None or not rank.isdigit() or not size.isdigit():
        return None
    return int(rank), int(size)


def rank_environment(base: dict[str, str], device: int) -> dict[str, str]:
    """The environment of a rank process the launcher starts on one host: one GPU visible, NVLink
    multicast off in NCCL (the machines require it; kept if the caller set it already)."""
    env = dict(base)
    visible = [d for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    env["CUDA_VISIBLE_DEVICES"] = visible[device].strip() if device < len(visible) else str(device)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    return env


def process_environment() -> dict[str, str]:
    return dict(os.environ)
