#!/usr/bin/env bash
# Nsight Compute on one sparse MLA decode call (split + combine), for the perf notes:
#   source .device-kit/setup.sh && bash benchmarks/ncu_decode.sh batch,heads,kv_format [...]
# NCU_METRICS adds metrics (comma-separated) to the stall reasons; their lines are printed too.
# NCU_SOURCE=1 instead writes the split kernel's per-SASS-instruction warp-stall samples as CSV
# (ncu-source-<case>.csv; benchmarks/sass_phases.py sums them between the kernel's barriers).
set -uo pipefail
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
  short_scoreboard wait lg_throttle mio_throttle math_pipe_throttle selected not_selected no_instruction \
  dispatch_stall branch_resolving membar sleeping)
for case in "$@"; do
  IFS=, read -r batch heads fmt <<< "$case"
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    what=(--section SourceCounters --page source --csv --print-source sass)
    dest="$OUT/ncu-source-${batch}x${heads}-${fmt}.csv"
  else
    what=(--section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats
          --section MemoryWorkloadAnalysis --metrics "${stalls%,}${NCU_METRICS:+,$NCU_METRICS}")
    dest="$OUT/ncu-decode-${batch}x${heads}-${fmt}.txt"
  fi
  ncu --clock-control none --kernel-name regex:Split --launch-skip 1 --launch-count 1 "${what[@]}" \
      python3 - "$batch" "$heads" "$fmt" > "$dest" 2>&1 <<'PY'
import sys, torch
sys.path.insert(0, ".")
from b12x.attention import sparse_mla as sm
from benchmarks.bench_sparse_mla_decode import make_pool
batch, heads, fmt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
g = torch.Generator(device="cuda").manual_seed(0)
pool = make_pool(fmt, 32768 if fmt == "fp8_ds_mla" else 16384, g)
p = sm.plan(sm.Caps(num_heads=heads, topk=2048, kv_format=fmt, max_rows=batch))
scratch = torch.empty(p.scratch_bytes(), dtype=torch.uint8, device="cuda")
q = torch.randn(batch, heads, 576, device="cuda", generator=g).bfloat16()
idx = torch.randint(0, pool.shape[0] * 64, (batch, 2048), device="cuda", generator=g, dtype=torch.int32)
lengths = torch.full((batch,), 2048, device="cuda", dtype=torch.int32)
b = sm.bind(p, scratch=scratch, q=q, indices=idx, lengths=lengths)
for _ in range(3):
    sm.run_decode(b, kv_cache=pool, sm_scale=576 ** -0.5)
torch.cuda.synchronize()
print("splits", b.partial_o.shape[1])
PY
  [ "${NCU_SOURCE:-0}" = 1 ] && { echo "$dest: $(wc -l < "$dest") lines"; continue; }
  f="$dest"
  grep -E "issue_stalled|L1/TEX Cache|Duration|Memory Throughput|DRAM Throughput|L2 Hit|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Issued Warp|Registers Per|splits${NCU_METRICS:+|${NCU_METRICS//,/|}}" "$f" | head -70
done
