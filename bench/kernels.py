"""Kernel benchmark runner: times every case of every bench/kernels_*.py module on the GPU.

Case interface (what a bench/kernels_<group>.py module provides)
-----------------------------------------------------------------
A module defines ``CASES``: a list of :class:`Case` (import it with ``from kernels import Case``; the
runner puts bench/ on sys.path, and so does ``python3 bench/kernels_<group>.py``). Building the
list must not touch the GPU; only ``setup`` may.

    Case(name="dense_bf16::gemv lm_head",      # kernel (header::entry) and what it runs
         shape="154880x4096 bf16",             # free text for the table
         bytes_moved=154880 * 4096 * 2 + ...,  # DRAM bytes one launch must move at least
         setup=make_lm_head)                   # () -> launch, see below

``setup()`` compiles the kernel (``kbpc.testing.gpu.load_module``), allocates its buffers and
returns ``launch(i)``: a callable that enqueues ONE run of the kernel on the default stream and
returns at once (no synchronisation, no allocation, no host copies). Use ``i`` to pick input set
``i % n`` of ``n = rotations(bytes_per_set)`` preallocated sets, so that consecutive launches touch
more than twice the 50 MB L2 and the timing is a DRAM timing. Everything ``setup`` allocates is
freed when ``launch`` is dropped (PyCUDA frees GPUArrays on garbage collection).

``bytes_moved`` counts the unavoidable traffic: every weight, scale and input byte read once and
every output byte written once. GB/s = bytes_moved / time; % is against the H200's 4.3 TB/s copy
bandwidth. ``floor_us(bytes)`` = the time that bandwidth needs.

Timing: each case is warmed up, then timed in batches of ``--batch`` back-to-back launches between
two CUDA events; a spin kernel enqueued before each batch lets the host queue the whole batch
before the GPU reaches it, so host launch overhead does not show in the kernel time. The table
shows the median over ``--reps`` batches (time per launch), and beside it a pure streaming read of
the same bytes timed the same way (``stream`` us, and the kernel's % of it: the ceiling in that
setting). With ``--graph``, cases whose ``launch(i, stream=None)`` takes a stream are also timed
inside a CUDA graph, each launch after a dependent tiny kernel (bench/ingraph.py), again beside the
streaming read in the same graph.

    python3 bench/kernels.py [--only SUBSTR] [--json FILE] [--reps 15] [--batch 20] [--graph]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
COPY_BW = 4.3e12  # bytes/s: H200 device-to-device copy bandwidth
L2_BYTES = 50 << 20


@dataclass
class Case:
    """One benchmark case; see the module docstring for the contract of ``setup``."""
    name: str
    shape: str
    bytes_moved: int
    setup: Callable[[], Callable[[int], None]]


def rotations(bytes_per_set: int, min_total: int = 4 * L2_BYTES, cap: int = 64) -> int:
    """How many input sets of `bytes_per_set` to rotate so the launches touch >= `min_total`."""
    return max(2, min(cap, -(-min_total // max(1, bytes_per_set))))


def floor_us(nbytes: int) -> float:
    """The bandwidth floor: microseconds to move `nbytes` at the copy bandwidth."""
    return nbytes / COPY_BW * 1e6


def load_cases(only: str | None = None) -> list[tuple[str, Case]]:
    """Import every bench/kernels_*.py and return (module group, case) pairs matching `only`."""
    sys.path.insert(0, str(BENCH_DIR))
    sys.path.insert(0, str(REPO_ROOT))
    out = []
    for path in sorted(BENCH_DIR.glob("kernels_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception:  # noqa: BLE001  (one broken module must not hide the others)
            print(f"!! {path.name}: import failed\n{traceback.format_exc()}", file=sys.stderr)
            continue
        for case in getattr(mod, "CASES", []):
            if only is None or only in case.name or only in path.stem:
                out.append((path.stem.removeprefix("kernels_"), case))
    return out


_SPIN_SRC = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def _spin_kernel():
    from kbpc.testing.gpu import load_module  # noqa: PLC0415
    return load_module(_SPIN_SRC, "bench_spin").get_function("spin")


def time_case(case: Case, reps: int, batch: int, spin) -> list[float]:
    """Per-launch microseconds of `reps` batches."""
    import numpy as np  # noqa: PLC0415
    import pycuda.driver as cuda  # noqa: PLC0415

    launch = case.setup()
    for i in range(3):
        launch(i)
    cuda.Context.synchronize()
    start, end = cuda.Event(), cuda.Event()
    times, i = [], 0
    for _ in range(reps):
        spin(np.int64(4_000_000), block=(1, 1, 1), grid=(1, 1))  # ~2 ms: the host queues ahead
        start.record()
        for _ in range(batch):
            launch(i)
            i += 1
        end.record()
        end.synchronize()
        times.append(start.time_till(end) * 1e3 / batch)
    del launch
    return times


def _measure(case: Case, reps: int, batch: int, spin, graph: bool, stream_cache: dict) -> dict:
    """us, GB/s, % of 4.3 TB/s, and the streaming read of the same bytes (alone; in-graph)."""
    import ingraph  # noqa: PLC0415  (bench/ingraph.py)

    t = statistics.median(time_case(case, reps, batch, spin))
    out = dict(us=t, gbps=case.bytes_moved / t / 1e3, pct=100 * floor_us(case.bytes_moved) / t)
    key = case.bytes_moved
    if key not in stream_cache:
        ref = ingraph.stream_read_case(key)
        stream_cache[key] = {"stream_us": statistics.median(time_case(ref, reps, batch, spin))}
        if graph:
            stream_cache[key]["g_stream_us"] = ingraph.time_in_graph(ref, reps)
    out.update(stream_cache[key])
    out["pct_stream"] = 100 * out["stream_us"] / t
    g_us = ingraph.time_in_graph(case, reps) if graph else None
    if g_us is not None:
        out.update(g_us=g_us, pct_g_stream=100 * out["g_stream_us"] / g_us)
    return out


def run(cases: list[tuple[str, Case]], reps: int, batch: int, graph: bool = False) -> list[dict]:
    import pycuda.autoprimaryctx  # noqa: F401, PLC0415

    spin = _spin_kernel()
    rows, stream_cache = [], {}
    for group, case in cases:
        row = {"group": group, "kernel": case.name, "shape": case.shape, "bytes": case.bytes_moved,
               "floor_us": floor_us(case.bytes_moved)}
        try:
            row.update(_measure(case, reps, batch, spin, graph, stream_cache))
        except Exception as exc:  # noqa: BLE001  (report and go on with the next case)
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"!! {case.name}: {row['error']}", file=sys.stderr)
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


HEADER = (f"{'kernel':<48} {'shape':<34} {'us':>9} {'floor':>8} {'GB/s':>8} {'%4.3TB/s':>9} {'stream':>8} "
          f"{'%strm':>6} {'graph':>8} {'g.strm':>8} {'%g.strm':>7}")


def format_row(row: dict) -> str:
    if "error" in row:
        return f"{row['kernel']:<48} {row['shape']:<34} {'ERROR':>9} {row['error'][:60]}"
    graph = (f" {row['g_us']:8.2f} {row['g_stream_us']:8.2f} {row['pct_g_stream']:6.1f}%" if "g_us" in row else "")
    return (f"{row['kernel']:<48} {row['shape']:<34} {row['us']:9.2f} {row['floor_us']:8.2f} "
            f"{row['gbps']:8.0f} {row['pct']:8.1f}% {row['stream_us']:8.2f} {row['pct_stream']:5.1f}%{graph}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="run only cases whose name or group contains this")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--list", action="store_true", help="list the cases and exit (no GPU needed)")
    ap.add_argument("--graph", action="store_true", help="also time in a CUDA graph after a dependent kernel")
    args = ap.parse_args(argv)
    cases = load_cases(args.only)
    if args.list:
        for group, case in cases:
            print(f"{group:<14} {case.name:<48} {case.shape:<34} floor {floor_us(case.bytes_moved):8.2f} us")
        return 0
    print(HEADER)
    rows = run(cases, args.reps, args.batch, args.graph)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
