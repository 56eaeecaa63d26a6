#!/usr/bin/env bash
# One GPU-box session: GPU tests, then benchmarks, each step under a time limit; full logs and JSON
# under $LOGS, packed into $OUT/session-<parts>.tgz after every step (the device tool brings back
# at most 8 files, and a call killed at its limit brings back what $OUT holds), short tables last.
#   source .device-kit/setup.sh && bash benchmarks/device_session.sh [PART[,PART...]|all] [pytest -k expr]
# PART: tests compat bench extend prefill dcp indexer v4 ceiling splits grouped. The step limits
# keep one part within a 600 s device call; run two parts in one call only where their limits
# add up to less. B12X_CACHE_DIR picks the artifact cache (a subset exported with
# `b12x-codegen export --preset ... --to .cache/sub`, carried beside .device-kit, fits the
# 64 MiB carry limit where the whole cache may not). The presets each part resolves:
#   grouped, prefill  deepseek-v3.2-indexer
#   extend            sparse-mla-all
#   v4                sparse-mla-model1, sparse-mla-v4-bf16, deepseek-v4-flash-tp{1,4,8}, deepseek-v4-pro-tp{1,2,4}
#   tests             nearly all (133 of 143 sm_90a specs): carry the whole .cache/b12x
set -uo pipefail
what=${1:-all}
kexpr=${2:-}
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
OUT=${OUT:-/tmp/b12x-out}
LOGS=${LOGS:-/tmp/b12x-logs}
mkdir -p "$OUT" "$LOGS"
rc=0
pack() { tar czf "$OUT/session-${what//,/-}.tgz" -C "$LOGS" . 2>/dev/null || true; }
step() {  # LIMIT_S LOG COMMAND...: the command's output to $LOGS/LOG; a failure or a timeout noted
  local limit=$1 log=$2 code
  shift 2
  timeout -k 10 "$limit" "$@" > "$LOGS/$log" 2>&1
  code=$?
  if [ $code -ne 0 ]; then
    echo "$log: rc=$code$([ $code -eq 124 ] && echo " (timed out at ${limit} s)")" >> "$LOGS/failed.txt"
    rc=1
  fi
  pack
}
part() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
PYTEST=(python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short --timeout 120)

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$LOGS/gpu.txt" 2>&1
python3 -c "import flash_mla" > "$LOGS/flashmla-import.txt" 2>&1 || true
if part tests; then
  # the grouped top-k's tests run in `grouped` (first GPU run of that code: a fault there would
  # break CUDA for every later test file of this process)
  step 540 gpu-tests.log "${PYTEST[@]}" tests/gpu --ignore tests/gpu/test_indexer_grouped_gpu.py ${kexpr:+-k "$kexpr"}
fi
if part compat; then
  # the vLLM B12X backend's call sequences on the upstream-named layer, the README blocks, the
  # indexer's row batches
  step 300 gpu-tests-compat.log "${PYTEST[@]}" tests/gpu/test_upstream_compat_gpu.py \
    tests/gpu/test_readme_examples_gpu.py tests/gpu/test_indexer_row_batches_gpu.py
fi
if part bench; then
  step 400 bench-decode.log python3 benchmarks/bench_sparse_mla_decode.py --json "$LOGS/decode.json" ${BENCH_ARGS:-}
fi
if part extend; then
  step 400 bench-extend.log python3 benchmarks/bench_sparse_mla_extend.py --json "$LOGS/extend.json"
fi
if part prefill; then
  # the indexer's prefill in bounded scratch (row batches) vs DeepGEMM mqa logits + torch.topk
  step 400 bench-indexer-prefill.log python3 benchmarks/bench_indexer_prefill.py --json "$LOGS/indexer-prefill.json"
fi
if part dcp; then
  step 300 bench-dcp.log python3 benchmarks/bench_dcp.py --json "$LOGS/dcp.json"
fi
if part indexer; then
  step 400 bench-indexer.log python3 benchmarks/bench_indexer.py --json "$LOGS/indexer.json" ${INDEXER_BENCH_ARGS:-}
fi
if part v4; then
  step 220 gpu-tests-v4.log "${PYTEST[@]}" tests/gpu/test_sparse_mla_model1_gpu.py tests/gpu/test_sparse_mla_v4_bf16_gpu.py
  step 180 bench-v4.log python3 benchmarks/bench_sparse_mla_v4.py --json "$LOGS/v4.json"
  step 120 bench-v4-prefill.log python3 benchmarks/bench_sparse_mla_v4_prefill.py --json "$LOGS/v4-prefill.json"
fi
if part ceiling; then
  # the gather ceiling of the 8-head floor (docs/notes/mma-forms.md, "8 heads per rank"), and the
  # 8-head warp-group form on mma.sync, checked and timed
  step 200 ceiling.log bash -c "nvcc -O3 -arch=sm_90a benchmarks/ceilings/gather_ceiling.cu -o /tmp/gather_ceiling \
    && /tmp/gather_ceiling"
  step 200 h8-warp-mma.log bash -c "nvcc -O3 -arch=sm_90a benchmarks/ceilings/h8_warp_mma.cu -o /tmp/h8_warp_mma \
    && /tmp/h8_warp_mma"
fi
if part grouped; then
  # the grouped top-k (Caps.group_select, docs/notes/topk.md): its GPU tests, the same logits both
  # ways, then the prefill bench each case both ways in one process (it writes its JSON after
  # every row)
  step 100 gpu-tests-grouped.log "${PYTEST[@]}" tests/gpu/test_indexer_grouped_gpu.py
  step 120 grouped-topk.log python3 benchmarks/probe_grouped_topk.py
  step 260 bench-indexer-prefill-grouped.log python3 benchmarks/bench_indexer_prefill.py --group-select both \
    --json "$LOGS/indexer-prefill-grouped.json"
fi
if part splits; then
  # the split-planner surveys the notes leave open (docs/notes/launch-and-splits.md, "Left"):
  # fp8 16 heads where three waves of short splits beat the plan, model1_fp8 at 8/16 heads between
  # the V4 bench's batches
  step 250 splits-fp8-h16.log python3 benchmarks/probe_splits.py --heads 16 --rows 80,88,96,100,104,112,120 \
    --splits 2,3,4,5,6,8
  step 250 splits-v4-h8-h16.log python3 benchmarks/probe_v4.py --cases 2x8,4x8,8x8,16x8,64x8,4x16,8x16,16x16,64x16 \
    --kinds swa,c4 --splits 1,2,3,4,5,6,8,10
fi

show() {  # TITLE LOG FILTER...: a log's short form, if the session wrote it
  local title=$1 log=$LOGS/$2
  shift 2
  [ -f "$log" ] && { echo "== $title"; "$@" "$log"; }
}
tests_summary() { grep -E "^(FAILED|ERROR)|passed|failed|error" "$1" | tail -40; }
show gpu gpu.txt cat
show "flash_mla import" flashmla-import.txt tail -3
show "failed or timed out" failed.txt cat
show "gpu tests" gpu-tests.log tests_summary
show "compat tests" gpu-tests-compat.log tests_summary
show "grouped top-k tests" gpu-tests-grouped.log tests_summary
show "v4 tests" gpu-tests-v4.log tests_summary
show "decode bench" bench-decode.log tail -30
show "extend bench" bench-extend.log tail -24
show "grouped top-k against wide" grouped-topk.log tail -10
show "indexer prefill bench" bench-indexer-prefill.log tail -8
show "indexer prefill bench, grouped both ways" bench-indexer-prefill-grouped.log tail -12
show "dcp bench" bench-dcp.log tail -8
show "indexer bench" bench-indexer.log tail -40
show "v4 bench" bench-v4.log tail -30
show "v4 prefill bench" bench-v4-prefill.log tail -8
show "gather ceiling" ceiling.log tail -30
show "8-head warp-group probe" h8-warp-mma.log tail -12
show "splits, fp8 16 heads" splits-fp8-h16.log grep rows
show "splits, V4 8/16 heads" splits-v4-h8-h16.log sed -n '/^ *case/,$p'
echo "== logs: $OUT/session-${what//,/-}.tgz"
exit $rc
