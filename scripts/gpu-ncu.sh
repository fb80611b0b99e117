#!/usr/bin/env bash
# Nsight Compute on single kernels of bench/kernels.py, one device call: for each "CASE=REGEX"
# argument, profiles one launch (after SKIP warm-up launches) of the kernels matching REGEX while
# bench/kernels.py runs the cases whose name contains CASE. Writes, under $OUT/ncu/: the report
# (.ncu-rep), its details page as text and, where this ncu can, the SASS source page with
# per-instruction counters; also disassembles the cubins named in CUBINS (paths in the tree).
# Usage: scripts/gpu-ncu.sh "moe_slots (step form) moe gate_up=w4a4_gemv_moe_slots" ...
#   REGEX matches the name the profiler sees: a case launched through the product launcher keeps the
#   kernel's own name; a case built from its own extern "C" wrapper (bench/kernels_*.py's _mod) is
#   named by that wrapper (e.g. "w4a16_mma::seg kda six=^s$").
set -uo pipefail
OUT="${OUT:-$PWD/gpu-ncu-out}"
mkdir -p "$OUT/ncu"
. scripts/device-env.sh
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
i=0
for spec in "$@"; do
    case_="${spec%%=*}"; regex="${spec#*=}"; i=$((i + 1))
    rep="$OUT/ncu/k$i"
    timeout "${NCU_LIMIT:-150}" "$NCU" --set "${NCU_SET:-full}" --target-processes all -k "regex:$regex" \
        -s "${SKIP:-8}" -c 1 -f -o "$rep" python3 bench/kernels.py --only "$case_" --reps 2 --batch 4 \
        > "$rep.run.log" 2>&1
    echo "== $i: $case_ / $regex: exit $?"
    "$NCU" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1 || true
    grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Executed Ipc Active|Achieved Occupancy|Registers Per|No Eligible|One or More Eligible" "$rep.details.txt" | head -12
done
for c in ${CUBINS:-}; do
    cuobjdump -sass "$c" > "$OUT/ncu/$(basename "$c").sass" 2>&1 || /usr/local/cuda/bin/cuobjdump -sass "$c" > "$OUT/ncu/$(basename "$c").sass" 2>&1
done
exit 0
