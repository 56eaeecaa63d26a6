#!/usr/bin/env bash
# One GPU-box session: GPU tests, then benchmarks; full logs under $OUT, short tables last.
#   source .device-kit/setup.sh && bash benchmarks/device_session.sh [tests|bench|extend|prefill|dcp|indexer|v4|ceiling|compat|splits|grouped|all] [pytest -k expr]
set -uo pipefail
what=${1:-all}
kexpr=${2:-}
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import flash_mla" > "$OUT/flashmla-import.txt" 2>&1 || true
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -m gpu tests/gpu ${kexpr:+-k "$kexpr"} -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1 || rc=1
fi
if [ "$what" = compat ]; then
  # the vLLM B12X backend's call sequences on the upstream-named layer, the README blocks, the
  # indexer's row batches
  python3 -m pytest -q -m gpu tests/gpu/test_upstream_compat_gpu.py tests/gpu/test_readme_examples_gpu.py \
    tests/gpu/test_indexer_row_batches_gpu.py \
    -p no:cacheprovider -rf --tb=short > "$OUT/gpu-tests.log" 2>&1 || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/bench_sparse_mla_decode.py --json "$OUT/decode.json" ${BENCH_ARGS:-} > "$OUT/bench-decode.log" 2>&1 || rc=1
fi
if [ "$what" = extend ] || [ "$what" = all ]; then
  python3 benchmarks/bench_sparse_mla_extend.py --json "$OUT/extend.json" > "$OUT/bench-extend.log" 2>&1 || rc=1
fi
if [ "$what" = prefill ] || [ "$what" = all ]; then
  # the indexer's prefill in bounded scratch (row batches) vs DeepGEMM mqa logits + torch.topk
  python3 benchmarks/bench_indexer_prefill.py --json "$OUT/indexer-prefill.json" > "$OUT/bench-indexer-prefill.log" 2>&1 || rc=1
fi
if [ "$what" = dcp ] || [ "$what" = all ]; then
  python3 benchmarks/bench_dcp.py --json "$OUT/dcp.json" > "$OUT/bench-dcp.log" 2>&1 || rc=1
fi
if [ "$what" = indexer ] || [ "$what" = all ]; then
  python3 benchmarks/bench_indexer.py --json "$OUT/indexer.json" ${INDEXER_BENCH_ARGS:-} > "$OUT/bench-indexer.log" 2>&1 || rc=1
fi
if [ "$what" = v4 ] || [ "$what" = all ]; then
  python3 -m pytest -q -m gpu tests/gpu/test_sparse_mla_model1_gpu.py tests/gpu/test_sparse_mla_v4_bf16_gpu.py \
    -p no:cacheprovider > "$OUT/gpu-tests-v4.log" 2>&1 || rc=1
  python3 benchmarks/bench_sparse_mla_v4.py --json "$OUT/v4.json" > "$OUT/bench-v4.log" 2>&1 || rc=1
  python3 benchmarks/bench_sparse_mla_v4_prefill.py --json "$OUT/v4-prefill.json" > "$OUT/bench-v4-prefill.log" 2>&1 || rc=1
fi
if [ "$what" = ceiling ] || [ "$what" = all ]; then
  # the gather ceiling of the 8-head floor (docs/notes/mma-forms.md, "8 heads per rank")
  nvcc -O3 -arch=sm_90a benchmarks/ceilings/gather_ceiling.cu -o /tmp/gather_ceiling > "$OUT/ceiling.log" 2>&1 &&
    /tmp/gather_ceiling >> "$OUT/ceiling.log" 2>&1 || rc=1
  # the 8-head warp-group form on mma.sync (docs/notes/mma-forms.md), checked and timed
  nvcc -O3 -arch=sm_90a benchmarks/ceilings/h8_warp_mma.cu -o /tmp/h8_warp_mma > "$OUT/h8-warp-mma.log" 2>&1 &&
    /tmp/h8_warp_mma >> "$OUT/h8-warp-mma.log" 2>&1 || rc=1
fi
if [ "$what" = grouped ]; then
  # the grouped top-k (Caps.group_select, docs/notes/topk.md): its GPU tests, the same logits both
  # ways, then the prefill bench each case both ways in one process
  # (time limits so that one slow part leaves the others' logs within a 600 s device call; the
  # bench prints each case's JSON line as it finishes)
  timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_indexer_grouped_gpu.py -p no:cacheprovider -rf --tb=short \
    > "$OUT/gpu-tests.log" 2>&1 || rc=1
  timeout 150 python3 benchmarks/probe_grouped_topk.py > "$OUT/grouped-topk.log" 2>&1 || rc=1
  timeout 300 python3 benchmarks/bench_indexer_prefill.py --group-select both \
    --json "$OUT/indexer-prefill-grouped.json" > "$OUT/bench-indexer-prefill.log" 2>&1 || rc=1
fi
if [ "$what" = splits ]; then
  # the split-planner surveys the notes leave open (docs/notes/launch-and-splits.md, "Left"):
  # fp8 16 heads where three waves of short splits beat the plan, model1_fp8 at 8/16 heads between
  # the V4 bench's batches
  python3 benchmarks/probe_splits.py --heads 16 --rows 80,88,96,100,104,112,120 --splits 2,3,4,5,6,8 \
    > "$OUT/splits-fp8-h16.log" 2>&1 || rc=1
  python3 benchmarks/probe_v4.py --cases 2x8,4x8,8x8,16x8,64x8,4x16,8x16,16x16,64x16 --kinds swa,c4 \
    --splits 1,2,3,4,5,6,8,10 > "$OUT/splits-v4-h8-h16.log" 2>&1 || rc=1
fi
echo "== gpu"; cat "$OUT/gpu.txt"
echo "== flash_mla import"; tail -3 "$OUT/flashmla-import.txt"
[ -f "$OUT/gpu-tests.log" ] && { echo "== gpu tests"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/gpu-tests.log" | tail -40; }
[ -f "$OUT/bench-decode.log" ] && { echo "== decode bench"; tail -30 "$OUT/bench-decode.log"; }
[ -f "$OUT/bench-extend.log" ] && { echo "== extend bench"; tail -12 "$OUT/bench-extend.log"; }
[ -f "$OUT/grouped-topk.log" ] && { echo "== grouped top-k against wide"; tail -10 "$OUT/grouped-topk.log"; }
[ -f "$OUT/bench-indexer-prefill.log" ] && { echo "== indexer prefill bench"; tail -8 "$OUT/bench-indexer-prefill.log"; }
[ -f "$OUT/bench-dcp.log" ] && { echo "== dcp bench"; tail -8 "$OUT/bench-dcp.log"; }
[ -f "$OUT/bench-indexer.log" ] && { echo "== indexer bench"; tail -40 "$OUT/bench-indexer.log"; }
[ -f "$OUT/gpu-tests-v4.log" ] && { echo "== v4 tests"; grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/gpu-tests-v4.log" | tail -20; }
[ -f "$OUT/bench-v4.log" ] && { echo "== v4 bench"; tail -30 "$OUT/bench-v4.log"; }
[ -f "$OUT/bench-v4-prefill.log" ] && { echo "== v4 prefill bench"; tail -8 "$OUT/bench-v4-prefill.log"; }
[ -f "$OUT/ceiling.log" ] && { echo "== gather ceiling"; tail -30 "$OUT/ceiling.log"; }
[ -f "$OUT/h8-warp-mma.log" ] && { echo "== 8-head warp-group probe"; tail -12 "$OUT/h8-warp-mma.log"; }
[ -f "$OUT/splits-fp8-h16.log" ] && { echo "== splits, fp8 16 heads"; grep rows "$OUT/splits-fp8-h16.log"; }
[ -f "$OUT/splits-v4-h8-h16.log" ] && { echo "== splits, V4 8/16 heads"; sed -n '/^ *case/,$p' "$OUT/splits-v4-h8-h16.log"; }
exit $rc
