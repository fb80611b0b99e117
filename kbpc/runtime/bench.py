"""`kbpc bench BUNDLE`: decode tokens/s at batch 1 (CUDA-graph replay, median after warm-up), and a
profiled step's time per kernel family, each against its bandwidth floor (bytes it must move, see
kbpc/runtime/traffic.py, over the copy bandwidth).

The context is reached by moving the sequence position forward over zeroed caches: the kernels
read the same number of cache bytes as with real history (what decides their speed), without
spending minutes decoding a long prompt first."""
from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

from kbpc.runtime.bundle_model import BundleModel
from kbpc.runtime.cuda_backend import CudaBackend
from kbpc.runtime.device import COPY_BYTES, COPY_REPEATS, local_device, measure_copy_bandwidth
from kbpc.runtime.traffic import family_bytes


def run_bench(model: BundleModel, context: int = 1024, runs: int = 30, warmup: int = 5,
              weights: str = "synthetic:0", bandwidth: float | None = None) -> dict:
    """`bandwidth` (bytes/s) is the yardstick of the floors; None measures the GPU's copy bandwidth."""
    plan = json.loads(model.bundle.read("plan.json"))
    backend = CudaBackend(model, weights, None)
    try:
        if bandwidth is None:
            yardstick = {"bytes_per_s": measure_copy_bandwidth(backend.cuda),
                         "source": f"measured: device-to-device copy of {COPY_BYTES >> 20} MiB, best of {COPY_REPEATS}"}
        else:
            yardstick = {"bytes_per_s": bandwidth, "source": "given (--bandwidth)"}
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
    per_us = yardstick["bytes_per_s"] / 1e6
    floor_us = step_bytes / per_us
    return {
        "schema": "kbpc-bench/v1", "blueprint_id": model.manifest["blueprint_id"], "plan_digest": model.manifest["plan_digest"],
        "target": model.manifest["target"], "device": local_device(backend.cuda).describe(),
        "bandwidth": yardstick, "context": start_pos, "runs": runs,
        "step_ms_median": median * 1e3, "tokens_per_s": 1.0 / median,
        "bytes_per_token": step_bytes, "floor_ms": floor_us / 1e3,
        "roofline_fraction": (floor_us / 1e6) / median,
        "launches_per_step": model.manifest["step"]["launches"],
        "profiled_step_ms": float(group_ms.sum()),
        "families": {f: {"us": per_family[f], "groups": launches[f], "bytes": fbytes.get(f, 0.0),
                         "floor_us": fbytes.get(f, 0.0) / per_us,
                         "fraction": (fbytes.get(f, 0.0) / per_us) / per_family[f]
                         if per_family[f] else None}
                     for f in sorted(per_family, key=lambda f: -per_family[f])},
    }
