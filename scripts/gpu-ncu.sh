#!/usr/bin/env bash
# Nsight Compute on single kernels of bench/kernels.py, one device call: for each "CASE=REGEX"
# argument, profiles one launch (after SKIP warm-up launches) of the kernels matching REGEX while
# bench/kernels.py runs the cases whose name contains CASE. Writes $OUT/ncu.tgz (the device tool
# brings back only a few files a call): per case its details page as text and, where this ncu can,
# the SASS source page with per-instruction counters (the reports too with KEEP_REPORTS=1); also
# disassembles the cubins named in CUBINS (paths in the tree).
# NCU_ARGS adds options (e.g. "--warp-sampling-interval 0" for fine warp-stall sampling of a short kernel).
# With BUNDLE=NAME each argument is a REGEX instead: one launch of the matching kernels inside the
# step, while `kbpc bench out/NAME.kbp --context ${CONTEXT:-1024}` runs (SKIP, default 8, counts that
# kernel's launches: the step's first graph replays). bench/ncu_stalls.py reads the sass.csv pages.
# Usage: scripts/gpu-ncu.sh "moe_slots (step form) moe gate_up=w4a4_gemv_moe_slots" ...
#        BUNDLE=seed-e128 SKIP=40 NCU_ARGS="--warp-sampling-interval 0" scripts/gpu-ncu.sh hc_boundary
#   (CASE=REGEX splits at the last "=", so a case name may hold one, e.g. "seq_reg cols=128=kda_recurrent")
#   REGEX matches the name the profiler sees: a case launched through the product launcher keeps the
#   kernel's own name; a case built from its own extern "C" wrapper (bench/kernels_*.py's _mod) is
#   named by that wrapper (e.g. "w4a16_mma::seg kda six=^s$").
set -uo pipefail
OUT="${OUT:-$PWD/gpu-ncu-out}"
W=/tmp/ncu-work; rm -rf "$W"; mkdir -p "$W/ncu" "$OUT"
. scripts/device-env.sh
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
i=0
for spec in "$@"; do
    case_="${spec%=*}"; regex="${spec##*=}"; i=$((i + 1))   # split at the last "=": case names hold "=" (cph=2)
    rep="$W/ncu/k$i"
    if [ -n "${BUNDLE:-}" ]; then
        regex="$spec"; case_="out/$BUNDLE.kbp"
        run=(python3 -m kbpc.cli bench "out/$BUNDLE.kbp" $TRUST --context "${CONTEXT:-1024}" --runs 3)
    else
        run=(python3 bench/kernels.py --only "$case_" --reps 2 --batch 4)
    fi
    # shellcheck disable=SC2086
    timeout "${NCU_LIMIT:-150}" "$NCU" --set "${NCU_SET:-full}" ${NCU_ARGS:-} --target-processes all -k "regex:$regex" \
        -s "${SKIP:-8}" -c 1 -f -o "$rep" "${run[@]}" > "$rep.run.log" 2>&1
    echo "== $i: $case_ / $regex: exit $?"
    "$NCU" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 || true
    grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Registers Per|No Eligible|One or More Eligible" "$rep.details.txt" | head -12
done
for c in ${CUBINS:-}; do
    cuobjdump -sass "$c" > "$W/ncu/$(basename "$c").sass" 2>&1 || /usr/local/cuda/bin/cuobjdump -sass "$c" > "$W/ncu/$(basename "$c").sass" 2>&1
done
[ "${KEEP_REPORTS:-0}" = 1 ] || rm -f "$W"/ncu/*.ncu-rep
tar czf "$OUT/ncu.tgz" -C "$W" ncu
exit 0
