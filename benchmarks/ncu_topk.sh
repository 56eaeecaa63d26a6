#!/usr/bin/env bash
# Nsight Compute on the wide-row top-k kernels (one launch each), for the perf notes:
#   source .device-kit/setup.sh && bash benchmarks/ncu_topk.sh rows,width [...]
set -uo pipefail
source "$(dirname "$0")/ncu_stalls.sh"
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
for case in "$@"; do
  ncu --clock-control none --kernel-name regex:Wide --launch-skip 0 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --metrics "$NCU_STALL_METRICS" python3 benchmarks/probe_topk.py --once "$case" > "$OUT/ncu-${case/,/x}.txt" 2>&1
  grep -E "issue_stalled|Wide|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Stall|Issued Warp|No Eligible|Registers Per|Block Limit" "$OUT/ncu-${case/,/x}.txt" | head -60; tail -5 "$OUT/ncu-${case/,/x}.txt"
done
