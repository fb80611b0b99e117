"""`kbpc run BUNDLE --tp R`: a tensor-parallel bundle decoded by its ranks, one process per GPU
(one host: the launcher of kbpc/runtime/ranks.py; across hosts: `mpirun -n R kbpc run BUNDLE`,
this process being one rank). Returns the same summary as a one-GPU run, or None when the model
is not a split bundle and no --tp above 1 was asked for."""
from __future__ import annotations

from pathlib import Path

from kbpc.errors import KbpcError
from kbpc.runtime.ranks import Deadlines, launch_ranks, rank_command
from kbpc.settings import mpi_rank_size


def bundle_ranks(model: Path, trust: tuple[Path, ...] = ()) -> int:
    """The ranks a bundle was split over (1 for a blueprint or an unsplit bundle)."""
    from kbpc.runtime.select import is_bundle

    if not is_bundle(model):
        return 1
    from kbpc.bundle.container import open_bundle
    from kbpc.bundle.keystore import trusted_keyring

    with open_bundle(model, trusted_keyring(tuple(trust))) as bundle:
        return int(bundle.manifest.get("tp_size") or 1)


def run_split(model: Path, tp: int | None, prompt: list[int], max_new_tokens: int, weights: str,
              trust: tuple[Path, ...] = (), step_timeout_s: float = 60.0, backend: str = "auto",
              config: Path | None = None) -> dict | None:
    from kbpc.runtime.select import SYNTHETIC_DEFAULT

    weights = weights or SYNTHETIC_DEFAULT
    ranks = bundle_ranks(model, trust)
    if ranks == 1 and tp is not None and tp > 1 and backend == "reference":
        return _reference_split(model, tp, prompt, max_new_tokens, weights, config)
    if tp is not None and tp != ranks:
        raise KbpcError(f"the model is split over {ranks} rank(s); compile it with --tp {tp} first "
                        f"(kbpc compile BLUEPRINT --tp {tp})" if ranks == 1 else
                        f"the bundle is split over {ranks} ranks, not {tp}", "--tp")
    if ranks == 1:
        return None
    mpi = mpi_rank_size()
    settings = {"bundle": str(Path(model).resolve()), "ranks": ranks, "weights": weights, "prompt": prompt,
                "max_new_tokens": max_new_tokens, "trust": [str(t) for t in trust] or None,
                "timeout_s": step_timeout_s}
    if mpi is not None:
        from kbpc.runtime.rank_worker import mpi_main
        if mpi[1] != ranks:
            raise KbpcError(f"mpirun started {mpi[1]} processes for a bundle of {ranks} ranks", "mpirun -n")
        return mpi_main(settings) or {"rank": mpi[0]}
    return launch_ranks(rank_command(settings), ranks,
                        Deadlines(first_step_s=step_timeout_s, step_s=step_timeout_s))


def verify_split(model, positions: int, weights: str, first_token: int = 1,
                 step_timeout_s: float = 600.0):
    """`kbpc verify --numerics` of a split bundle (a BundleModel): its ranks on this host's GPUs
    against the split math's reference; rank 0's per-position report."""
    from kbpc.runtime.numerics import NumericsReport

    ranks = int(model.manifest["tp"]["ranks"])
    settings = {"bundle": str(Path(model.bundle.path).resolve()), "ranks": ranks, "weights": weights,
                "prompt": [first_token], "max_new_tokens": 1, "trust": list(model.trust_sources) or None,
                "timeout_s": 120.0, "verify": positions, "first_token": first_token}
    got = launch_ranks(rank_command(settings), ranks, Deadlines(first_step_s=step_timeout_s, step_s=step_timeout_s))
    report = NumericsReport(positions, got["mode"])
    report.rel_l2, report.same_token = list(got["rel_l2"]), list(got["same_token"])
    return report


def _reference_split(blueprint: Path, tp: int, prompt: list[int], max_new_tokens: int, weights: str,
                     config: Path | None) -> dict:
    """A blueprint's split math on the CPU: its ranks in the reference interpreter, in lockstep."""
    from kbpc.frontend.load import load_blueprint
    from kbpc.ir.plan import Options
    from kbpc.passes import run_pipeline
    from kbpc.reference.tensor_parallel import RankedReference
    from kbpc.runtime.generate import check_prompt, generate
    from kbpc.runtime.reference_backend import load_weights

    from kbpc.runtime.select import is_bundle
    if is_bundle(blueprint):
        raise KbpcError("the reference backend splits a blueprint JSON, not a compiled bundle", "--tp")
    bp = load_blueprint(blueprint, config)
    backend = RankedReference(run_pipeline(bp, Options(tp=tp)), load_weights(bp, weights),
                              len(prompt) + max_new_tokens)
    check_prompt(prompt, backend.vocab)
    return {"backend": f"reference x{tp} ranks", **generate(backend, prompt, max_new_tokens).to_json()}
