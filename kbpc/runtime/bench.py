"""`kbpc bench BUNDLE`: decode tokens/s at batch 1 (CUDA-graph replay, median after warm-up), and a
profiled step's time per group, reported per kernel family against each family's bandwidth floor
(bench_report.py turns the measurement into the report, the trace and the plot, without a GPU).

The context is reached by moving the sequence position forward over caches filled with synthetic
history (random latent codes and indexer pool keys): the kernels read the same number of cache bytes
as with real history, and the indexer's top-k sorts a real spread of scores (zeroed pool keys would
make every score tie), without spending minutes decoding a long prompt first."""
from __future__ import annotations

import time

from kbpc.runtime.bench_report import Measurement, bench_report
from kbpc.errors import DeviceError
from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.cuda_backend import CudaBackend
from kbpc.runtime.device import COPY_BYTES, COPY_REPEATS, local_device, measure_copy_bandwidth
from kbpc.runtime.traffic import family_bytes
from kbpc.weights.synthetic import FP8_WEIGHT_CODES

# History state filled before timing: name suffix -> (kind, scale, offset) of kbp_fill_synthetic
# (kind 0: uniform FP32 in offset +- scale; kind 3: signed E4M3 codes in FP8_WEIGHT_CODES).
_HISTORY = {".latent_cache": (3, 0.0, 0.0), ".pool_keys": (0, 1.0, 0.0), ".pool_codes": (3, 0.0, 0.0),
            ".pool_scales": (0, 0.0, 1.0)}
_F32_HISTORY = (0, 1.0, 0.0)   # an FP32 latent cache (a --no-act-quant build): uniform values, not codes


def history_rule(name: str, storage: str) -> tuple[int, float, float] | None:
    """How fill_history fills the state buffer `name` of `storage` (None: left as it is)."""
    rule = next((r for suffix, r in _HISTORY.items() if name.endswith(suffix)), None)
    if rule is not None and rule[0] == 3 and storage == "f32":
        return _F32_HISTORY
    return rule


def fill_history(backend: CudaBackend, seed: int = 7) -> None:
    """Synthetic values in the caches a long context has written (see the module docstring)."""
    lo, hi = FP8_WEIGHT_CODES
    for i, (spec, buf) in enumerate(zip(backend.model.manifest["state"], backend.state)):
        rule = history_rule(spec["name"], spec.get("storage", ""))
        if rule is None:
            continue
        kind, scale, offset = rule
        storage, count = (0, spec["bytes"] // 4) if kind == 0 else (2, spec["bytes"])
        err = backend.lib.kbp_fill_synthetic(int(buf), count, seed * 1000003 + i, kind, scale, offset, lo, hi, storage)
        if err:
            raise DeviceError(f"filling {spec['name']} with synthetic history failed (CUDA error {err})")


GREEDY_ON_GPU = "token upload, graph replay, greedy token on the GPU and its 8-byte read-back"
GREEDY_ON_HOST = "token upload, graph replay, logits copy and greedy scan on the host (a library without kbp_greedy)"


def timed_step_covers(backend: CudaBackend) -> str:
    """What one timed step includes, as the report says it."""
    return GREEDY_ON_GPU if hasattr(backend.lib, "kbp_greedy") else GREEDY_ON_HOST


def timed_steps(backend: CudaBackend, warmup: int, runs: int) -> list[float]:
    """Seconds of each of `runs` decode steps (`next_token`: what a greedy decode loop pays for a
    token) after `warmup` untimed ones."""
    for _ in range(warmup):
        backend.next_token(1)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        backend.next_token(1)
        times.append(time.perf_counter() - t0)
    return times


def measure(model: BundleModel, context: int = 1024, runs: int = 30, warmup: int = 5,
            weights: str = "synthetic:0", bandwidth: float | None = None) -> Measurement:
    """`bandwidth` (bytes/s) is the yardstick of the floors; None measures the GPU's copy bandwidth."""
    backend = CudaBackend(model, weights, None)
    try:
        if bandwidth is None:
            yardstick = (measure_copy_bandwidth(backend.cuda),
                         f"measured: device-to-device copy of {COPY_BYTES >> 20} MiB, best of {COPY_REPEATS}")
        else:
            yardstick = (bandwidth, "given (--bandwidth)")
        fill_history(backend)
        backend.position = min(context, backend.max_context - warmup - runs - 2)
        start = backend.position
        times = timed_steps(backend, warmup, runs)
        mark_ms = backend.profile_step(1)
        device = local_device(backend.cuda).describe()
        edges = backend.graph_edges()
        covers = timed_step_covers(backend)
    finally:
        backend.close()
    return Measurement(context=start, step_seconds=tuple(times), mark_ms=tuple(float(x) for x in mark_ms),
                       bandwidth=yardstick[0], bandwidth_source=yardstick[1], device=device, graph_edges=edges,
                       timed_step=covers)


def run_bench(model: BundleModel, context: int = 1024, runs: int = 30, warmup: int = 5,
              weights: str = "synthetic:0", bandwidth: float | None = None) -> tuple[dict, Measurement, dict]:
    """(the report, the measurement, the plan as plan.json holds it)."""
    plan = model.bundle.read_json("plan.json")
    m = measure(model, context, runs, warmup, weights, bandwidth)
    report = bench_report(model.run, plan, family_bytes(model.blueprint, plan, m.context, model.run.marks), m)
    return report, m, plan
