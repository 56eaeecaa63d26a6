#!/usr/bin/env bash
# Same-machine A/B of this tree's kernels against a base tree's, processes alternating new/base.
#
# On the build box: export the base commit and build its artifacts into its own cache, e.g.
#   mkdir -p scratch/base && git archive <base> | tar -x -C scratch/base --exclude=generated
#   (cd scratch/base && B12X_CACHE_DIR=$PWD/.cache/b12x PYTHONPATH=$PWD python -m codegen.cli build --preset P)
# with P the presets the benches need on both trees (`--only decode_h8_,...` builds just some of
# their specs; device_session.sh's header says which part needs which). The new side reads
# NEW_CACHE (default $B12X_CACHE_DIR, else .cache/b12x): an exported subset keeps the carry under
# 64 MiB. Then carry scratch/ (git-ignored) with .device-kit and the cache, and on the GPU box,
# after `source .device-kit/setup.sh`:
#   bash benchmarks/ab_session.sh decode      # logs and JSON packed into $OUT/ab-<benches>.tgz
# Both sides run this tree's bench scripts (copied into the base tree first; SAME_BENCH=0 keeps
# the base's own), so the two sides measure the same grid with the same arguments: a bench that
# calls an API the base lacks fails on the base side, with its error in the log.
# BASE (default scratch/base) names the base tree; DEC_ARGS / EXT_ARGS / IDX_ARGS / PRE_ARGS pass
# options to the decode / extend / indexer / indexer prefill benches; TB is each bench's time
# limit in seconds; ROUNDS (default 2) the processes a side for decode and extend. Keep the sum of
# the runs' limits inside the 600 s of one device call: one bench a call.
set -uo pipefail
what=${1:-decode}
root=$PWD
base=${BASE:-$root/scratch/base}
new_cache=${NEW_CACHE:-${B12X_CACHE_DIR:-$root/.cache/b12x}}
OUT=${OUT:-/tmp/b12x-out}
LOGS=${LOGS:-/tmp/b12x-ab-logs}
mkdir -p "$OUT" "$LOGS"
if [ "${SAME_BENCH:-1}" = 1 ]; then
  rm -rf "$base/benchmarks" && cp -r "$root/benchmarks" "$base/benchmarks"
fi
run() {  # side bench [tag]
  local side=$1 b=$2 tag=${3:-} dir=$root cache=$new_cache args
  [ "$side" = base ] && { dir=$base; cache=$base/.cache/b12x; }
  case $b in
    bench_sparse_mla_decode.py) args=${DEC_ARGS:-} ;;
    bench_sparse_mla_extend.py) args=${EXT_ARGS:-} ;;
    bench_indexer_prefill.py) args=${PRE_ARGS:-} ;;
    *) args=${IDX_ARGS:-} ;;
  esac
  ( cd "$dir" && export B12X_CACHE_DIR=$cache PYTHONPATH=$dir:/tmp/b12x-kit/site &&
    timeout -k 10 "${TB:-240}" python3 "benchmarks/$b" $args --json "$LOGS/$side-${b%.py}$tag.json" \
      > "$LOGS/$side-${b%.py}$tag.log" 2>&1; echo "$side $b$tag rc=$?" | tee -a "$LOGS/runs.txt" )
  tar czf "$OUT/ab-${what//,/-}.tgz" -C "$LOGS" . 2>/dev/null || true
}
rounds=$(seq 1 "${ROUNDS:-2}")
for w in ${what//,/ }; do
  case $w in
    decode) for i in $rounds; do for s in new base; do run $s bench_sparse_mla_decode.py "-$i"; done; done ;;
    extend) for i in $rounds; do for s in new base; do run $s bench_sparse_mla_extend.py "-$i"; done; done ;;
    indexer) for s in new base; do run $s bench_indexer.py; done ;;
    prefill) for s in new base; do run $s bench_indexer_prefill.py; done ;;
    *) echo "ab_session: unknown bench $w (decode, extend, indexer, prefill)" >&2; exit 2 ;;
  esac
done
