"""Where the time goes inside the kernels of the replayed step: the phase stamps of a profiling
build (`kbpc compile --stamps`, kernels/kbp_stamps.cuh), CTA by CTA, per launch, relative to each
sublayer's opening hc boundary.

    PYTHONPATH=. python3 bench/replay_stamps.py out/seed-e128-stamps.kbp --trust out/keys/signing-key.pub.json \\
        --context 16384 --replays 8 -o out/stamps-16k.json [--kernel dsa_index_select]

Each replay is a decode step as `kbpc bench` times it (`next_token`), with every stamp log emptied
before it and read after it (the clears and reads are outside the replay). Writes OUT (schema
kbpc-replay-stamps/v1: per launch, per stamp, the median over replays of its first / median / last
CTA in us after the anchor, and per sublayer kind the launches in launch order; bench/stamp_phases.py
says how records become launches) and prints the per-kernel table (medians over each kernel's
launches too), or with --chain the per-sublayer view; --trace writes the last replay's CTAs on a
track per SM (Chrome/Perfetto). The stamps cost each instrumented CTA
an atomic and a few stores, so compare a stamp build's kernel-level timings with its own, and its
step time with `kbpc bench` of the product build (printed here as host-timed replays)."""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_timeline import bundle_launches, replay_arguments  # noqa: E402
from stamp_phases import DEFAULT_ANCHORS, StampError, chain_table, chains, chrome_trace, summarize, table  # noqa: E402
from timeline_launches import TimelineError  # noqa: E402


def record(model, context: int, replays: int, warmup: int, weights: str) -> tuple[list[dict], list[float], int, int]:
    """(per replay: instance -> records; host-timed replays in seconds; the start position; CTAs
    beyond a log's capacity, summed)."""
    from kbpc.runtime.bench import fill_history
    from kbpc.runtime.cuda_backend import CudaBackend
    from kbpc.runtime.stamps import CAPACITY

    backend = CudaBackend(model, weights, None)
    try:
        logs = backend.stamp_logs()
        fill_history(backend)
        backend.position = start = max(0, min(context, backend.max_context - warmup - replays - 2))
        for _ in range(warmup):
            backend.next_token(1)
        out, host, dropped = [], [], 0
        for _ in range(replays):
            logs.clear()
            t0 = time.perf_counter()
            backend.next_token(1)      # returns once the step and its greedy token are done
            host.append(time.perf_counter() - t0)
            read = logs.read()
            dropped += sum(max(0, log.began - CAPACITY) for log in read)
            out.append({log.instance: log.records for log in read})
        return out, host, start, dropped
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    ap = replay_arguments(__doc__.split("\n\n")[0], replays=8, warmup=3)
    ap.add_argument("--anchor", action="append", default=[],
                    help=f"kernel name text of the anchor launches (repeatable; default {', '.join(DEFAULT_ANCHORS)})")
    ap.add_argument("--kernel", help="print only kernels whose name contains this text (the JSON has all)")
    ap.add_argument("--chain", action="store_true",
                    help="print per sublayer kind every launch's stamps in launch order (medians over the "
                         "sublayers) instead of the per-kernel table")
    ap.add_argument("--trace", type=Path, help="also write the last replay's CTAs here as a Chrome/Perfetto "
                                               "trace, a track per SM (tens of MB for the seed)")
    args = ap.parse_args(argv)
    if args.replays < 1:
        ap.error("--replays must be >= 1")

    from kbpc.bundle.keystore import trusted_keyring
    from kbpc.errors import KbpcError
    from kbpc.runtime.bundle_model import load_bundle_model

    anchors = tuple(args.anchor) or DEFAULT_ANCHORS
    try:
        model = load_bundle_model(args.bundle, trusted_keyring(tuple(args.trust)))
        launches = bundle_launches(model)
        replays, host, start, dropped = record(model, args.context, args.replays, args.warmup, args.weights)
        summary = summarize(replays, launches, anchors)
    except (TimelineError, StampError, KbpcError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    run = model.run
    summary.update(bundle=str(args.bundle), blueprint_id=run.blueprint_id, plan_digest=run.plan_digest,
                   target=run.target, context=start, dropped_ctas=dropped,
                   host_replay_ms_median=statistics.median(host) * 1e3)
    args.output.write_text(json.dumps(summary, indent=1) + "\n")
    if args.trace:
        args.trace.write_text(json.dumps(chrome_trace(replays[-1], launches, f"{args.bundle.name} CTAs by SM")))
    summary["chains"] = chains(summary, launches)
    print(chain_table(summary["chains"]) if args.chain else table(summary, args.kernel))
    print(f"host-timed stamped replays: {summary['host_replay_ms_median']:.3f} ms median"
          + (f"; {dropped} CTAs beyond the logs' capacity were not stored" if dropped else "")
          + f"; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
