#!/usr/bin/env bash
# Replay timelines on the GPU machine (one device call): for each bundle named on the command line
# (out/NAME.kbp, compiled beforehand on any machine with nvcc, keyring in out/keys),
# bench/replay_timeline.py records REPLAYS graph replays at CONTEXT with torch.profiler; every
# summary (timeline-NAME.json), Chrome/Perfetto trace (timeline-NAME.trace.json) and log goes into
# $OUT/timeline.tgz, and each bundle's table is printed.
# Usage: scripts/gpu-timeline.sh NAME...     e.g. scripts/gpu-timeline.sh seed-e128 seed-e128-kda
#   CONTEXT (default 1024), REPLAYS (default 20), TIMELINE_LIMIT seconds per bundle (default 240)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BUNDLE_NAME..." >&2; exit 2; }
W=/tmp/timeline; rm -rf "$W"; mkdir -p "$W"
. scripts/device-env.sh
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())" 2>&1 | tee "$W/torch.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee "$W/gpu.txt"
rc=0
for arg in "$@"; do
    name=$(basename "$arg" .kbp)
    bundle="out/$name.kbp"
    if [ ! -f "$bundle" ]; then echo "== $name: no $bundle" | tee -a "$W/missing.txt"; rc=1; continue; fi
    timeout "${TIMELINE_LIMIT:-240}" python3 bench/replay_timeline.py "$bundle" $TRUST --context "${CONTEXT:-1024}" \
        --replays "${REPLAYS:-20}" -o "$W/timeline-$name.json" > "$W/timeline-$name.log" 2>&1
    status=$?
    [ $status -eq 0 ] || rc=1
    echo "== $name (exit $status)"
    head -22 "$W/timeline-$name.log"
done
tar czf "${OUT:-$PWD}/timeline.tgz" -C "$W" .
exit $rc
