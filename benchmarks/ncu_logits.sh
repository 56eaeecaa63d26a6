#!/usr/bin/env bash
# Nsight Compute on the indexer logits kernel (one launch), for the perf notes:
#   source .device-kit/setup.sh && bash benchmarks/ncu_logits.sh [batch ctx next_n]
#   source .device-kit/setup.sh && bash benchmarks/ncu_logits.sh contiguous rows ctx     # prefill rows
set -uo pipefail
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
ncu --clock-control none --kernel-name regex:IndexerLogits --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    --metrics smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio \
    python3 benchmarks/probe_logits.py "$@" > "$OUT/ncu-${NCU_TAG:-logits}.txt" 2>&1
grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Registers Per|Block Limit|Eligible Warps|Est. Speedup|stalled|issue_stalled" "$OUT/ncu-${NCU_TAG:-logits}.txt" | head -60
