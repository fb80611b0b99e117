#!/usr/bin/env bash
# One device call for a round of kernel changes (bundles compiled beforehand into out/, keyring in
# out/keys), each step optional and under its own time limit, everything in $OUT/round.tgz:
#   GPU_TESTS  pytest paths of the GPU tests to run
#   VERIFY     bundle names: `kbpc verify --numerics --positions 64` against the reference
#   COMPARE    "BASE:OTHER[,OTHER...] ..." bundle names: scripts/compare_logits.py (bit for bit)
#   AB         "NAME:CONTEXT ..." interleaved step benchmarks (scripts/gpu-ab.sh, RUNS replays each)
#   TIMELINE   bundle names: replay timelines at CONTEXT (scripts/gpu-timeline.sh)
#   STAMPS     "NAME:CONTEXT ..." profiling builds (kbpc compile --stamps): in-kernel phase stamps of
#              REPLAYS (default 8) replays, bench/replay_stamps.py, stamps-NAME-CONTEXT.json
# Usage: GPU_TESTS="tests/gpu/test_x.py" VERIFY="tiny deep" COMPARE="a:b,c" AB="a:1024 b:1024" scripts/gpu-round.sh
set -uo pipefail
W=/tmp/round; rm -rf "$W"; mkdir -p "$W"
. scripts/device-env.sh
KBPC="python3 -m kbpc.cli"
rc=0
note() { echo "== $*" | tee -a "$W/round.log"; }
if [ -n "${GPU_TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${TEST_LIMIT:-300}" python3 -m pytest -m gpu $GPU_TESTS -q -rfE -p no:cacheprovider \
        -n "${PYTEST_WORKERS:-8}" > "$W/pytest.log" 2>&1 || rc=1
    note "tests: $(tail -1 "$W/pytest.log")"
    grep -E "^(FAILED|ERROR)" "$W/pytest.log" | head -20
fi
for name in ${VERIFY:-}; do
    timeout "${VERIFY_LIMIT:-150}" $KBPC verify "out/$name.kbp" $TRUST --numerics --positions "${POSITIONS:-64}" -q \
        --json-out "$W/numerics-$name.json" > "$W/numerics-$name.log" 2>&1 || rc=1
    note "verify $name: $(tail -2 "$W/numerics-$name.log" | tr '\n' ' ')"
done
for pair in ${COMPARE:-}; do
    base="${pair%%:*}"; others="${pair#*:}"
    # shellcheck disable=SC2046
    timeout "${COMPARE_LIMIT:-150}" python3 scripts/compare_logits.py "out/$base.kbp" $(printf 'out/%s.kbp ' ${others//,/ }) \
        $TRUST --positions "${COMPARE_POSITIONS:-16}" --json-out "$W/compare-$base.json" > "$W/compare-$base.log" 2>&1 || rc=1
    note "compare $pair: $(grep -E "bit-equal|DIFFERS" "$W/compare-$base.log" | tr '\n' ' ')"
done
if [ -n "${AB:-}" ]; then
    # shellcheck disable=SC2086
    OUT="$W" scripts/gpu-ab.sh $AB | tee -a "$W/round.log" || rc=1
fi
if [ -n "${TIMELINE:-}" ]; then
    # shellcheck disable=SC2086
    OUT="$W" scripts/gpu-timeline.sh $TIMELINE > "$W/timeline.log" 2>&1 || rc=1
    grep -E "^== " "$W/timeline.log"
fi
for pair in ${STAMPS:-}; do
    name="${pair%%:*}"; ctx="${pair#*:}"
    timeout "${STAMPS_LIMIT:-150}" python3 bench/replay_stamps.py "out/$name.kbp" $TRUST --context "$ctx" \
        --replays "${REPLAYS:-8}" -o "$W/stamps-$name-$ctx.json" > "$W/stamps-$name-$ctx.log" 2>&1 || rc=1
    note "stamps $pair: $(tail -1 "$W/stamps-$name-$ctx.log")"
done
tar czf "${OUT:-$PWD}/round.tgz" -C "$W" .
exit $rc
