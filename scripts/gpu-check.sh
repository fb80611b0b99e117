#!/usr/bin/env bash
# GPU check, run on the GPU machine from the repository root:
#   installs the carried wheels (.whl/, copied from /work/shared/device/), prints nvidia-smi, runs
#   every @pytest.mark.gpu test, then the kernel benchmark, and writes logs + a summary under $OUT.
# A failing test does not stop the benchmark; the exit code is non-zero if either step failed.
# Arguments are passed to bench/kernels.py (e.g. --only w4a16). PYTEST_ARGS adds pytest options.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl 2>&1 | tail -3
    export PYTHONPATH="$HOME/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
export KBPC_TEST_CUBIN_CACHE="${KBPC_TEST_CUBIN_CACHE:-/tmp/kbpc-cubins}"

{ nvidia-smi; nvcc --version | tail -1; python3 --version; } 2>&1 | tee "$OUT/env.txt"

# shellcheck disable=SC2086
python3 -m pytest -m gpu tests -q -rfE ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log"
test_rc=${PIPESTATUS[0]}

python3 bench/kernels.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}

{
    echo "== gpu-check summary =="
    echo "tests: $(tail -1 "$OUT/pytest.log")  (exit $test_rc)"
    echo "bench: exit $bench_rc"
    python3 - "$OUT/bench.json" <<'PY' || true
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"{'kernel':<50} {'us':>9} {'floor':>8} {'%BW':>6}")
for r in rows:
    if "error" in r:
        print(f"{r['kernel']:<50} ERROR {r['error'][:60]}")
    else:
        print(f"{r['kernel']:<50} {r['us']:9.2f} {r['floor_us']:8.2f} {r['pct']:5.1f}%")
PY
} 2>&1 | tee "$OUT/summary.txt"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
