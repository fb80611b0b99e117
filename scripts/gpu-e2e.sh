#!/usr/bin/env bash
# End-to-end check on the GPU machine (one device call): the tiny bundles and the full-depth toy
# shrinks (out/deep*.kbp) against the reference interpreter (every intermediate with the
# debug-arena build, then 64 positions of logits), the fast seed shrink with and without PDL bit for
# bit (scripts/compare_logits.py), every
# out/seed-*.kbp decoded and benchmarked, then the GPU tests named by GPU_TESTS (default: all).
# Bundles are compiled beforehand on any machine with nvcc (scripts/compile-e2e.sh) into out/,
# with the keyring in out/keys.
# Usage: scripts/gpu-e2e.sh [OUTDIR]   (logs and JSON under OUTDIR, default /tmp/gpu-e2e-out, and in $OUT/e2e.tgz)
#   BENCH_CONTEXTS  contexts for out/seed-e128.kbp (default "1024 16384"); other seed bundles: 1024
#   GPU_TESTS       pytest paths/args for the GPU tests ("" skips them)
#   TEST_LIMIT      seconds the GPU tests may take (default 900), so the archive is always written
set -uo pipefail
OUTDIR="${1:-/tmp/gpu-e2e-out}"   # archived into $OUT/e2e.tgz (the device tool returns a few files only)
mkdir -p "$OUTDIR"
. scripts/device-env.sh
KBPC="python3 -m kbpc.cli"
rc=0
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv | tee "$OUTDIR/gpu.txt"
step() { echo "== $*"; "$@" || rc=1; }
if [ -f out/tiny-debug.kbp ]; then   # compiled with --debug-arena: every intermediate vs the reference
    step $KBPC verify out/tiny-debug.kbp $TRUST --numerics --intermediates --positions 4 -q 2>&1 | tail -15 | tee "$OUTDIR/intermediates.log"
fi
for t in out/tiny*.kbp out/deep*.kbp; do
    [ -f "$t" ] || continue
    [ "$t" = out/tiny-debug.kbp ] && continue
    name=$(basename "$t" .kbp)
    step $KBPC verify "$t" $TRUST --numerics --positions 64 -q --json-out "$OUTDIR/numerics-$name.json" 2>&1 | tail -3 | tee "$OUTDIR/numerics-$name.log"
done
if [ -f out/seed-e128.kbp ] && [ -f out/seed-e128-nopdl.kbp ]; then   # PDL changes when kernels start, not what they compute
    step python3 scripts/compare_logits.py out/seed-e128.kbp out/seed-e128-nopdl.kbp $TRUST --positions 16 \
        --json-out "$OUTDIR/pdl-vs-nopdl.json" 2>&1 | tail -2 | tee "$OUTDIR/pdl-vs-nopdl.log"
fi
for b in out/seed-*.kbp; do
    [ -f "$b" ] || continue
    name=$(basename "$b" .kbp)
    case "$name" in
        seed-e128|seed-e128-exact) contexts="${BENCH_CONTEXTS:-1024 16384}" ;;
        *-512k) contexts="${LONG_CONTEXTS:-131072 524288}" ;;
        *) contexts=1024 ;;
    esac
    for ctx in $contexts; do
        step $KBPC bench "$b" $TRUST --context "$ctx" --runs 20 --json-out "$OUTDIR/bench-$name-$ctx.json" 2>&1 | tee "$OUTDIR/bench-$name-$ctx.log" | head -3
    done
done
if [ -n "${GPU_TESTS-tests/gpu}" ]; then
    timeout "${TEST_LIMIT:-900}" python3 -m pytest -m gpu ${GPU_TESTS-tests/gpu} -q -rfE -p no:cacheprovider -n "${PYTEST_WORKERS:-8}" 2>&1 | tee "$OUTDIR/pytest.log" | tail -30
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
python3 - "$OUTDIR" <<'PY' || true
import glob, json, os, sys
print("== summary")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    r = json.load(open(path))
    print(f"{os.path.basename(path):<40} {r['tokens_per_s']:7.1f} tok/s {r['step_ms_median']:7.3f} ms "
          f"{100 * r['roofline_fraction']:5.1f}% launches {r['launches_per_step']} profiled {r['profiled_step_ms']:.3f} ms")
PY
# Everything in one archive (the device tool returns a few files only).
[ -n "${OUT:-}" ] && tar czf "$OUT/e2e.tgz" -C "$OUTDIR" .
exit $rc
