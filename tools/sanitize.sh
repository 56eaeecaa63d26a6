#!/usr/bin/env bash
# compute-sanitizer over a small call of every kernel family and form (tools/sanitize.py), on the
# GPU box, after `source .device-kit/setup.sh` (or any install with the artifacts built):
#   bash tools/sanitize.sh [memcheck,initcheck,racecheck,synccheck] [sanitize.py args]
# Full logs under $OUT (default /tmp/b12x-sanitize); a table of reports per tool and call last.
# Only b12x's kernels are instrumented (--kernel-name kns=kernel_cutlass), torch's run natively,
# except under initcheck: it learns what is initialised only from the writes of instrumented
# kernels (and the memcpy / memset API), so with the filter every input torch wrote reads as
# uninitialised. initcheck instruments everything, and runs without torch's caching allocator so
# that each tensor is its own allocation (a read of scratch our kernels never wrote is then seen,
# instead of being masked by an earlier tensor's writes to the same block).
set -uo pipefail
tools=${1:-memcheck,initcheck,racecheck,synccheck}
shift || true
OUT=${OUT:-/tmp/b12x-sanitize}
mkdir -p "$OUT"
export B12X_CACHE_DIR=${B12X_CACHE_DIR:-$PWD/.cache/b12x}
cs=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}"/bin/compute-sanitizer \
     "${CUDA_HOME:-/usr/local/cuda}"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
[ -n "$cs" ] || { echo "compute-sanitizer not found (CUDA_HOME=${CUDA_HOME:-unset})"; exit 2; }
rc=0
for t in ${tools//,/ }; do
  extra="--kernel-name kns=kernel_cutlass" envs=""
  [ "$t" = racecheck ] && extra="$extra --racecheck-report hazard"
  [ "$t" = initcheck ] && extra="" envs="PYTORCH_NO_CUDA_MEMORY_CACHING=1"
  env $envs "$cs" --tool "$t" $extra --print-limit 200 --error-exitcode 3 \
    python3 tools/sanitize.py "$@" > "$OUT/sanitize-$t.log" 2>&1
  code=$?
  [ $code -ne 0 ] && rc=1
  echo "== $t (exit $code): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$OUT/sanitize-$t.log" | tail -1)"
  # reports per call: lines naming an error/hazard after each "-- call" marker
  awk '/^-- /{call=substr($0,4)} /^========= (Invalid|Error|ERROR:|Warning|Barrier|Uninitialized|Race)/ {n[call]++}
       END {for (c in n) printf "   %5d  %s\n", n[c], c}' "$OUT/sanitize-$t.log" | sort -k2 | head -60
  grep -q "sanitize: all calls ran" "$OUT/sanitize-$t.log" || echo "   (did not finish: see $OUT/sanitize-$t.log)"
done
exit $rc
