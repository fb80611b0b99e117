#!/usr/bin/env bash
# Fill .whl/ with the Python wheels the GPU machine's image lacks (carried with `carry: [".whl"]`,
# installed there by scripts/device-env.sh): the shared set in ../shared/device/ (PyCUDA, lark,
# cryptography and their needs) plus jsonschema and its needs, which the bench report's GPU test
# (tests/gpu/test_gpu_bench.py) imports. Run on this machine (pip needs a package index); the
# downloads are cp312 manylinux wheels, as that image's Python 3.12 takes them.
# Usage: scripts/device-wheels.sh [SHARED_DIR]   (default ../shared/device)
set -euo pipefail
SHARED="${1:-../shared/device}"
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
cp "$SHARED"/*.whl .whl/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl jsonschema jsonschema-specifications referencing rpds-py attrs typing-extensions
ls .whl
