"""Timeline of the replayed decode step: when each kernel of the CUDA graph ran, on which stream,
how long, how far after its predecessor, beside how many others (the serialized profile of
`kbpc bench` cannot show this: it times groups one after another, outside the graph).

    PYTHONPATH=. python3 bench/replay_timeline.py out/seed-e128.kbp --trust out/keys/signing-key.pub.json \\
        --context 1024 --replays 20 -o out/timeline-seed-e128.json

Writes OUT (the summary, schema kbpc-replay-timeline/v1: bench/timeline_summary.py says what is in
it) and OUT with .trace.json (Chrome/Perfetto: chrome://tracing or ui.perfetto.dev, one track per
stream), prints a short table. A bench script, not part of kbpc: torch is imported only in
record_replays. The bundle runs through the product runner (kbpc/runtime/cuda_backend.py, as
`kbpc bench` does); its graph replays are recorded with torch.profiler (Kineto over CUPTI), which
sees the library's kernels because the runner and torch share the device's primary context. Each
replay is a decode step as `kbpc bench` times it (`next_token`): the graph, then the runner's
greedy kernel outside it (runtime_stub/kbp_greedy.cu), which the timeline leaves out."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from timeline_launches import TimelineError, kernel_names, launch_table  # noqa: E402
from timeline_summary import chrome_trace, kernel_records, split_replays, summarize, table  # noqa: E402

_NOTHING = ("torch.profiler recorded no kernel of the step. Try: (1) python3 -c 'import torch; "
            "print(torch.version.cuda, torch.cuda.is_available())' (a CPU-only torch records nothing); "
            "(2) KINETO_LOG_LEVEL=0 to see whether CUPTI loaded, and put the CUPTI library of the "
            "nvidia-cuda-cupti wheel (site-packages/nvidia/cuda_cupti/lib) on LD_LIBRARY_PATH; "
            "(3) CUDA_VISIBLE_DEVICES=0, so that torch and PyCUDA pick the same device (both use its "
            "primary context: kbpc/runtime/cuda_backend.py retains it through pycuda.autoprimaryctx).")


RUNTIME_KERNELS = ("greedy_bf16",)   # launched by the runner after each replay, not in the graph


def graph_records(records: list) -> list:
    """The kernel records of the step graph: without the runner's own kernels."""
    return [r for r in records if not any(k in r.name for k in RUNTIME_KERNELS)]


def bundle_launches(model) -> list:
    """The step program's launch table (bench/timeline_launches.py) from the bundle's sources."""
    paths = [m["path"] for m in model.bundle.members]
    if "src/step.cu" not in paths:
        raise TimelineError("the bundle has no src/step.cu (a tensor-parallel bundle has one per rank; "
                            "the timeline runs single-GPU bundles)")
    sources = {p: model.bundle.read(p).decode() for p in paths if p.startswith("src/kernels/") and p.endswith(".cu")}
    return launch_table(model.bundle.read("src/step.cu").decode(), kernel_names(sources))


def record_replays(model, context: int, replays: int, warmup: int, weights: str) -> tuple[dict, list[float], int]:
    """(the profiler's Chrome trace of `replays` graph replays; host-timed replays before profiling
    in seconds, to compare the span with the unprofiled step; the position the replays started at)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        raise TimelineError(f"the timeline records with torch.profiler: {exc} (pip install torch)") from None

    from kbpc.runtime.bench import fill_history, timed_steps
    from kbpc.runtime.cuda_backend import CudaBackend

    backend = CudaBackend(model, weights, None)
    try:
        if not torch.cuda.is_available():
            raise TimelineError(_NOTHING)
        torch.cuda.init()
        fill_history(backend)
        backend.position = start = max(0, min(context, backend.max_context - warmup - 2 * replays - 2))
        host = timed_steps(backend, warmup, replays)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                backend.next_token(1)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kineto.json"
            prof.export_chrome_trace(str(path))
            return json.loads(path.read_text()), host, start
    finally:
        backend.close()


def replay_arguments(description: str, replays: int, warmup: int) -> argparse.ArgumentParser:
    """The options every replay script takes (this one, bench/replay_stamps.py): the bundle, its
    keyring, the context, the replays and warm-up steps, the weights and the output file."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--trust", type=Path, action="append", default=[], help="trusted public key file(s)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=replays)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--weights", default="synthetic:0")
    ap.add_argument("-o", "--output", type=Path, required=True)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], replays=20, warmup=5)
    ap.add_argument("--raw", type=Path, help="also keep the profiler's own trace here")
    args = ap.parse_args(argv)
    if args.replays < 1:
        ap.error("--replays must be >= 1")

    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.errors import KbpcError
    from kbpc.runtime.bundle_model import load_bundle_model

    model = load_bundle_model(args.bundle, trusted_keyring(tuple(args.trust)))
    try:
        launches = bundle_launches(model)
        raw, host, start = record_replays(model, args.context, args.replays, args.warmup, args.weights)
        if args.raw:
            args.raw.write_text(json.dumps(raw))
        records = graph_records(kernel_records(raw))
        if not records:
            raise TimelineError(_NOTHING)
        replays = split_replays(records, len(launches))
    except (TimelineError, KbpcError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(replays, launches)
    run = model.run
    summary.update(bundle=str(args.bundle), blueprint_id=run.blueprint_id, plan_digest=run.plan_digest,
                   target=run.target, context=start, options=model.manifest.get("options", {}),
                   host_replay_ms_median=statistics.median(host) * 1e3)
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    trace_path = args.output.with_suffix(".trace.json")
    trace_path.write_text(json.dumps(chrome_trace(replays, launches, f"{args.bundle.name} replays")) + "\n")
    print(table(summary))
    print(f"host-timed replay without the profiler: {summary['host_replay_ms_median']:.3f} ms median; "
          f"wrote {args.output} and {trace_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
