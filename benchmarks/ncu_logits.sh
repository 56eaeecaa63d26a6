#!/usr/bin/env bash
# Nsight Compute on the indexer logits kernel (one launch), for the perf notes:
#   source .device-kit/setup.sh && bash benchmarks/ncu_logits.sh [batch ctx next_n]
#   source .device-kit/setup.sh && bash benchmarks/ncu_logits.sh contiguous rows ctx     # prefill rows
set -uo pipefail
source "$(dirname "$0")/ncu_stalls.sh"
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
ncu --clock-control none --kernel-name regex:IndexerLogits --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    --metrics "$NCU_STALL_METRICS" \
    python3 benchmarks/probe_logits.py "$@" > "$OUT/ncu-${NCU_TAG:-logits}.txt" 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Registers Per|Block Limit|Eligible Warps|Est. Speedup|stalled|issue_stalled" "$OUT/ncu-${NCU_TAG:-logits}.txt" | head -60
