"""One rank's process: `python -m kbpc.runtime.rank_worker SETTINGS_JSON` under the one-host
launcher (kbpc/runtime/ranks.py: events on stdout, the NCCL id on stdin), or `kbpc run` itself
under mpirun (the id broadcast with mpi4py; rank 0 prints the result).

Settings: bundle, rank, ranks, weights, prompt, max_new_tokens, trust (keyring paths or null),
timeout_s (every wait on the GPU and on the peers); with `verify` (positions) the ranks run the
numerics check instead: rank 0 steps the split math's reference (kbpc.reference.tensor_parallel)
in lockstep, every rank is fed its greedy tokens (teacher forcing, shared through NCCL) and rank
0's result is the per-position report."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

from kbpc.errors import KbpcError


def emit(**event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def run_rank(settings: dict, share_id: Callable[[bytes | None], bytes],
             report: Callable[..., None]) -> dict | None:
    """Run rank settings["rank"]; `share_id(id or None)` gives rank 0's NCCL id to every rank.
    Returns rank 0's result (None on other ranks)."""
    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.runtime.bundle_model import load_bundle_model
    from kbpc.runtime.generate import generate
    from kbpc.runtime.tp_backend import TpRankBackend, open_rank_library, unique_id

    rank = int(settings["rank"])
    trust = trusted_keyring([Path(p) for p in settings["trust"]]) if settings.get("trust") else None
    model = load_bundle_model(Path(settings["bundle"]), trust)
    ranks = int((model.manifest.get("tp") or {}).get("ranks", 1))
    if ranks != int(settings["ranks"]):
        raise KbpcError(f"the bundle is split over {ranks} ranks, not {settings['ranks']}", "--tp")
    with tempfile.TemporaryDirectory(prefix=f"kbpc-rank{rank}-") as tmp:
        lib = open_rank_library(model, rank, Path(tmp))
        nccl_id = share_id(unique_id(lib) if rank == 0 else None)
        backend = TpRankBackend(model, lib, rank, nccl_id, settings["weights"], float(settings["timeout_s"]))
        try:
            report(event="ready")
            if settings.get("verify"):
                out = verify_rank(model, backend, settings, report)
            else:
                out = generate(backend, list(settings["prompt"]), int(settings["max_new_tokens"]),
                               on_token=lambda i: report(event="step", n=i + 1)).to_json()
        finally:
            backend.close()
    return out if rank == 0 else None


def verify_rank(model, backend, settings: dict, report) -> dict:
    """Teacher-forced numerics of the split step: rank 0 compares the gathered logits with the
    reference's at every position; the reference's greedy token feeds every rank."""
    import struct

    import numpy as np

    from kbpc.ir.plan import Options
    from kbpc.passes import run_pipeline
    from kbpc.reference.tensor_parallel import RankedReference
    from kbpc.runtime.numerics import NumericsReport
    from kbpc.runtime.reference_backend import load_weights

    positions = int(settings["verify"])
    options = Options(**model.manifest["options"])
    mode = options.numerics
    out = NumericsReport(positions, mode)
    ref = None
    if backend.rank == 0:
        bp = model.blueprint
        ref = RankedReference(run_pipeline(bp, options), load_weights(bp, settings["weights"]), positions)
    token = int(settings.get("first_token", 1))
    for pos in range(positions):
        logits, nxt = backend.step(token)
        if ref is not None:
            want, ref_next = ref.step(token)
            want = np.asarray(want, np.float64).ravel()
            diff = np.linalg.norm(np.asarray(logits, np.float64).ravel() - want)
            out.rel_l2.append(float(diff / (np.linalg.norm(want) or 1.0)))
            out.same_token.append(nxt == ref_next)
            nxt = ref_next
        shared = backend._exchange(struct.pack("<i", nxt), 4)
        token = struct.unpack("<i", shared[0][:4])[0]
        report(event="step", n=pos + 1)
    return out.to_json()


def launcher_main(settings: dict) -> int:
    """Under the one-host launcher: events to stdout, the id from stdin."""
    def share_id(own: bytes | None) -> bytes:
        if own is not None:
            emit(event="id", id=own.hex())
            return own
        line = sys.stdin.readline()
        if not line:
            raise KbpcError("the launcher closed before sending the NCCL id")
        return bytes.fromhex(json.loads(line)["id"])

    try:
        result = run_rank(settings, share_id, emit)
    except Exception as exc:   # a rank reports every failure, then exits non-zero
        emit(event="error", message=str(exc))
        return 2
    if result is not None:
        emit(event="result", result=result)
    return 0


def mpi_main(settings: dict) -> dict | None:
    """Under mpirun: mpi4py broadcasts rank 0's id; a failure aborts every rank (MPI_Abort)."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise KbpcError("running under mpirun needs mpi4py on every host (pip install mpi4py)") from None
    comm = MPI.COMM_WORLD
    settings = {**settings, "rank": comm.Get_rank(), "ranks": comm.Get_size()}
    try:
        return run_rank(settings, lambda own: comm.bcast(own, root=0), lambda **e: None)
    except Exception as exc:
        sys.stderr.write(f"kbpc: error: rank {comm.Get_rank()}: {exc}\n")
        sys.stderr.flush()
        comm.Abort(2)
        raise


if __name__ == "__main__":
    sys.exit(launcher_main(json.loads(sys.argv[1])))
