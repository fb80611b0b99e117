#!/usr/bin/env bash
# One device call: the GPU tests named by GPU_TESTS, every out/seed-*.kbp benchmarked at 1k context,
# then the kernel benchmark groups (each under its own time limit), all results in $OUT/variants.tgz.
set -uo pipefail
W=/tmp/variants; mkdir -p $W
. scripts/device-env.sh
KBPC="python3 -m kbpc.cli"
if [ -n "${GPU_TESTS:-}" ]; then
    python3 -m pytest -m gpu $GPU_TESTS -q -rfE -s -p no:cacheprovider -n 6 > $W/pytest.log 2>&1
    tail -8 $W/pytest.log; grep -h "GPU (fast) vs\|(b) GPU" $W/pytest.log | head -3
fi
for b in out/seed-*.kbp; do
    name=$(basename "$b" .kbp)
    $KBPC bench "$b" $TRUST --context 1024 --runs 30 --json-out "$W/bench-$name.json" > "$W/bench-$name.log" 2>&1
    echo "$name: $(head -1 $W/bench-$name.log)"
done
for g in ${BENCH_GROUPS:-misc kda projections dsa}; do
    timeout "${BENCH_LIMIT:-90}" python3 bench/kernels.py --only "$g" --graph --json "$W/kernels-$g.json" > "$W/kernels-$g.log" 2>&1
    echo "kernels $g: exit $?"
done
tar czf "$OUT/variants.tgz" -C $W .
