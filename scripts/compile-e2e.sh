#!/usr/bin/env bash
# Compile the bundles scripts/gpu-e2e.sh checks (any machine with nvcc), into out/ with the keyring
# in out/keys: the tiny example in exact and fast mode (and a debug-arena build), the 128-expert
# shrink of the seed in fast and exact mode, the fast build without PDL (gpu-e2e.sh compares their
# logits bit for bit), the same without fusion and PDL (the baseline, WITH_BASE=1), a
# fast build sized for 512k context, and the full-depth (45-layer) toy shrink of the seed in exact
# and fast mode (what `kbpc verify --numerics` checks over every layer kind and depth).
set -euo pipefail
SEED=examples/glm-5.3-flash-nvfp4-tp3-512k.decode1.graph.json
KBPC="python3 -m kbpc.cli"
mkdir -p out
[ -f out/keys/signing-key.pem ] || [ -f out/keys/signing-key.json ] || $KBPC keygen -o out/keys
KEY=out/keys/signing-key.pem; [ -f "$KEY" ] || KEY=out/keys/signing-key.json
K="--key $KEY -j ${JOBS:-2}"
$KBPC compile examples/tiny.graph.json -o out/tiny.kbp --numerics exact --max-context 128 $K
$KBPC compile examples/tiny.graph.json -o out/tiny-fast.kbp --numerics fast --max-context 128 $K
$KBPC compile examples/tiny.graph.json -o out/tiny-debug.kbp --numerics exact --max-context 128 --debug-arena $K
$KBPC shrink $SEED -o out/deep.json --preset tiny --layers 0-44
$KBPC compile out/deep.json -o out/deep.kbp --numerics exact --max-context 128 $K
$KBPC compile out/deep.json -o out/deep-fast.kbp --numerics fast --max-context 128 $K
$KBPC shrink $SEED -o out/seed-e128.json --set experts=128
$KBPC compile out/seed-e128.json -o out/seed-e128.kbp --numerics fast --max-context 17000 $K
$KBPC compile out/seed-e128.json -o out/seed-e128-exact.kbp --numerics exact --max-context 17000 $K
# The same fast build without programmatic dependent launch: gpu-e2e.sh holds the two to the same bits.
$KBPC compile out/seed-e128.json -o out/seed-e128-nopdl.kbp --numerics fast --max-context 17000 --no-pdl $K
[ -n "${WITH_BASE:-}" ] && $KBPC compile out/seed-e128.json -o out/seed-e128-base.kbp --numerics exact --max-context 17000 --no-fuse --no-pdl $K
$KBPC compile out/seed-e128.json -o out/seed-e128-512k.kbp --numerics fast --max-context 524288 $K
ls -la out
