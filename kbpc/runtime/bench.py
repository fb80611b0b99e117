"""`kbpc bench BUNDLE`: decode tokens/s at batch 1 (CUDA-graph replay, median after warm-up), and a
profiled step's time per kernel family, each against its bandwidth floor (bytes it must move, see
kbpc/runtime/traffic.py, over the copy bandwidth).

The context is reached by moving the sequence position forward over caches filled with synthetic
history (random latent codes and indexer pool keys): the kernels read the same number of cache bytes
as with real history, and the indexer's top-k sorts a real spread of scores (zeroed pool keys would
make every score tie), without spending minutes decoding a long prompt first."""
from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

from kbpc.errors import DeviceError
from kbpc.passes.schedule_streams import BANDWIDTH_BYTES_PER_US
from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.cuda_backend import CudaBackend
from kbpc.runtime.traffic import family_bytes
from kbpc.weights.synthetic import FP8_WEIGHT_CODES

# History state filled before timing: name suffix -> (kind, scale, offset) of kbp_fill_synthetic
# (kind 0: uniform FP32 in offset +- scale; kind 3: signed E4M3 codes in FP8_WEIGHT_CODES).
_HISTORY = {".latent_cache": (3, 0.0, 0.0), ".pool_keys": (0, 1.0, 0.0), ".pool_codes": (3, 0.0, 0.0),
            ".pool_scales": (0, 0.0, 1.0)}


def fill_history(backend: CudaBackend, seed: int = 7) -> None:
    """Synthetic values in the caches a long context has written (see the module docstring)."""
    lo, hi = FP8_WEIGHT_CODES
    for i, (spec, buf) in enumerate(zip(backend.model.manifest["state"], backend.state)):
        rule = next((r for suffix, r in _HISTORY.items() if spec["name"].endswith(suffix)), None)
        if rule is None:
            continue
        kind, scale, offset = rule
        storage, count = (0, spec["bytes"] // 4) if kind == 0 else (2, spec["bytes"])
        err = backend.lib.kbp_fill_synthetic(int(buf), count, seed * 1000003 + i, kind, scale, offset, lo, hi, storage)
        if err:
            raise DeviceError(f"filling {spec['name']} with synthetic history failed (CUDA error {err})")


def run_bench(model: BundleModel, context: int = 1024, runs: int = 30, warmup: int = 5,
              weights: str = "synthetic:0") -> dict:
    plan = json.loads(model.bundle.read("plan.json"))
    backend = CudaBackend(model, weights, None)
    try:
        fill_history(backend)
        backend.position = min(context, backend.max_context - warmup - runs - 2)
        start_pos = backend.position
        for _ in range(warmup):
            backend.step(1)
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            backend.step(1)
            times.append(time.perf_counter() - t0)
        group_ms = backend.profile_step(1)
    finally:
        backend.close()
    order = sorted(plan["schedule"], key=lambda s: s["position"])
    family_of = {g["id"]: g["family"] for g in plan["groups"]}
    per_family: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for s, ms in zip(order, group_ms):
        per_family[family_of[s["group"]]] += ms * 1e3
        launches[family_of[s["group"]]] += 1
    fbytes = family_bytes(model.blueprint, plan, start_pos)
    step_bytes = sum(fbytes.values())
    median = statistics.median(times)
    floor_us = step_bytes / BANDWIDTH_BYTES_PER_US
    return {
        "blueprint_id": model.manifest["blueprint_id"], "plan_digest": model.manifest["plan_digest"],
        "target": model.manifest["target"], "context": start_pos, "runs": runs,
        "step_ms_median": median * 1e3, "tokens_per_s": 1.0 / median,
        "bytes_per_token": step_bytes, "floor_ms": floor_us / 1e3,
        "roofline_fraction": (floor_us / 1e6) / median,
        "launches_per_step": model.manifest["step"]["launches"],
        "profiled_step_ms": float(group_ms.sum()),
        "families": {f: {"us": per_family[f], "groups": launches[f], "bytes": fbytes.get(f, 0.0),
                         "floor_us": fbytes.get(f, 0.0) / BANDWIDTH_BYTES_PER_US,
                         "fraction": (fbytes.get(f, 0.0) / BANDWIDTH_BYTES_PER_US) / per_family[f]
                         if per_family[f] else None}
                     for f in sorted(per_family, key=lambda f: -per_family[f])},
    }
