"""The environment variables kbpc reads, in one place."""
from __future__ import annotations

import os

# Rank and size as MPI launchers (Open MPI, MPICH/PMI, Slurm) export them to each process.
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def nccl_home() -> str | None:
    """KBPC_NCCL_HOME: a folder with include/nccl.h and lib/libnccl.so.2 (kbpc.toolchain.nccl)."""
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
