#!/usr/bin/env bash
# End-to-end check on the GPU machine (one device call): the tiny bundle against the reference
# interpreter (kbpc verify --numerics), the 128-expert seed decoding and benchmarked at 1k and 16k
# context, then the GPU kernel tests. Bundles are compiled beforehand (any machine with nvcc) into
# out/ and carried with the keyring:
#   kbpc compile examples/tiny.graph.json -o out/tiny.kbp --key out/keys/signing-key.json
#   kbpc shrink <seed> -o out/seed-e128.json --set experts=128
#   kbpc compile out/seed-e128.json -o out/seed-e128.kbp --max-context 17000 --key ...
# Usage: scripts/gpu-e2e.sh [OUTDIR]   (writes logs and JSON results under OUTDIR, default $OUT)
set -uo pipefail
OUTDIR="${1:-${OUT:-$PWD/gpu-e2e-out}}"
mkdir -p "$OUTDIR"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl 2>&1 | tail -2
    export PYTHONPATH="$HOME/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
KBPC="python3 -m kbpc.cli"
TRUST="--trust out/keys/signing-key.pub.json"
rc=0
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUTDIR/gpu.txt"
step() { echo "== $*"; "$@" || rc=1; }
if [ -f out/tiny-debug.kbp ]; then   # compiled with --debug-arena: every intermediate vs the reference
    step $KBPC verify out/tiny-debug.kbp $TRUST --numerics --intermediates --positions 4 -q 2>&1 | tee "$OUTDIR/intermediates.log"
fi
step $KBPC verify out/tiny.kbp $TRUST --numerics --positions 64 --json-out "$OUTDIR/numerics.json" 2>&1 | tee "$OUTDIR/numerics.log"
if [ -f out/seed-e128.kbp ]; then
    step $KBPC run out/seed-e128.kbp $TRUST --prompt-ids 1,2,3,4 --max-new-tokens 16 --context 64 --json 2>&1 | tee "$OUTDIR/seed-run.log"
    for ctx in 1024 16384; do
        step $KBPC bench out/seed-e128.kbp $TRUST --context $ctx --runs 20 --json-out "$OUTDIR/bench-$ctx.json" 2>&1 | tee "$OUTDIR/bench-$ctx.log"
    done
fi
python3 -m pytest -m gpu ${GPU_TESTS:-tests/gpu} -q -x -rfE 2>&1 | tail -25 | tee "$OUTDIR/pytest.log"
exit $rc
