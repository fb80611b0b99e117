#!/usr/bin/env bash
# Side-by-side step benchmarks in one device call: each NAME:CONTEXT argument runs
# `kbpc bench out/NAME.kbp --context CONTEXT` (bundles compiled beforehand, keyring in out/keys),
# in the order given, so variants measured in one call share the machine's state; list a bundle
# twice to see the run-to-run spread. JSON and logs go into $OUT/ab.tgz and a table is printed.
# Usage: scripts/gpu-ab.sh seed-e128:1024 seed-e128-prev:1024 seed-e128:16384 ...
#   RUNS (default 30) replays per bench.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 NAME:CONTEXT..." >&2; exit 2; }
W=/tmp/ab; rm -rf "$W"; mkdir -p "$W"
. scripts/device-env.sh
rc=0
i=0
for arg in "$@"; do
    name="${arg%%:*}"; ctx="${arg##*:}"; i=$((i + 1))
    tag="$(printf %02d $i)-$name-$ctx"
    python3 -m kbpc.cli bench "out/$name.kbp" $TRUST --context "$ctx" --runs "${RUNS:-30}" \
        --json-out "$W/bench-$tag.json" > "$W/bench-$tag.log" 2>&1 || rc=1
done
python3 - "$W" <<'PY' || true
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "bench-*.json"))):
    r = json.load(open(path))
    print(f"{os.path.basename(path)[6:-5]:<34} {r['step_ms_median']:7.3f} ms {r['tokens_per_s']:7.1f} tok/s "
          f"{100 * r['roofline_fraction']:5.1f}% of floor, launches {r['launches_per_step']}, "
          f"serialized profile {r['profiled_step_ms']:.3f} ms")
PY
tar czf "${OUT:-$PWD}/ab.tgz" -C "$W" .
exit $rc
