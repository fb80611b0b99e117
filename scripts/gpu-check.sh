#!/usr/bin/env bash
# GPU check, run on the GPU machine from the repository root: installs the carried wheels (.whl/,
# filled by scripts/device-wheels.sh: ../shared/device/ plus jsonschema and its needs), prints the
# GPU, runs every @pytest.mark.gpu test (in parallel workers: PYTEST_WORKERS, default 8) and, unless
# SKIP_BENCH=1, the kernel benchmarks; logs and a summary under $OUT.
# A failing test does not stop the benchmark; the exit code is non-zero if either step failed.
# Arguments are passed to bench/kernels.py (e.g. --only w4a16). PYTEST_ARGS adds pytest options.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
. scripts/device-env.sh

{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv; nvcc --version | tail -1; python3 --version; } 2>&1 | tee "$OUT/env.txt"

# shellcheck disable=SC2086
python3 -m pytest -m gpu tests -q -rfE -p no:cacheprovider -n "${PYTEST_WORKERS:-8}" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -40
test_rc=${PIPESTATUS[0]}

bench_rc=0
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    python3 bench/kernels.py --json "$OUT/bench.json" "$@" > "$OUT/bench.log" 2>&1
    bench_rc=$?
    tail -60 "$OUT/bench.log"
fi
echo "== gpu-check: tests exit $test_rc, bench exit $bench_rc"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
