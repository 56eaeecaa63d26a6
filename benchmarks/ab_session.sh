#!/usr/bin/env bash
# Same-machine A/B of this tree's kernels against a base tree's, processes alternating new/base.
#
# On the build box: export the base commit and build its artifacts into its own cache, e.g.
#   mkdir -p scratch/base && git archive <base> | tar -x -C scratch/base --exclude=generated
#   (cd scratch/base && B12X_CACHE_DIR=$PWD/.cache/b12x PYTHONPATH=$PWD python -m codegen.cli build --preset sparse-mla-all)
# (`--only decode_h8_,...` builds just the specs a bench needs, on both trees)
# then carry scratch/ (git-ignored) with .device-kit and run on the GPU box, after
# `source .device-kit/setup.sh`:
#   bash benchmarks/ab_session.sh decode,extend,indexer      # logs and JSON under $OUT
# BASE (default scratch/base) names the base tree; DEC_ARGS / EXT_ARGS / IDX_ARGS pass options to
# the benches (PRE_ARGS: the indexer prefill's); TB is each bench's time limit in seconds.
set -uo pipefail
what=${1:-decode,extend}
root=$PWD
base=${BASE:-$root/scratch/base}
OUT=${OUT:-/tmp/b12x-out}
mkdir -p "$OUT"
run() {  # side bench [tag]
  local side=$1 b=$2 tag=${3:-} dir=$root args
  [ "$side" = base ] && dir=$base
  case $b in
    bench_sparse_mla_decode.py) args=${DEC_ARGS:-} ;;
    bench_sparse_mla_extend.py) args=${EXT_ARGS:-} ;;
    bench_indexer_prefill.py) args=${PRE_ARGS:-} ;;
    *) args=${IDX_ARGS:-} ;;
  esac
  ( cd "$dir" && export B12X_CACHE_DIR=$dir/.cache/b12x PYTHONPATH=$dir:/tmp/b12x-kit/site &&
    timeout "${TB:-240}" python3 "benchmarks/$b" $args --json "$OUT/$side-${b%.py}$tag.json" \
      > "$OUT/$side-${b%.py}$tag.log" 2>&1; echo "$side $b$tag rc=$?" )
}
for w in ${what//,/ }; do
  case $w in
    decode) for i in 1 2; do for s in new base; do run $s bench_sparse_mla_decode.py "-$i"; done; done ;;
    extend) for i in 1 2; do for s in new base; do run $s bench_sparse_mla_extend.py "-$i"; done; done ;;
    indexer) for s in new base; do run $s bench_indexer.py; done ;;
    prefill) for s in new base; do run $s bench_indexer_prefill.py; done ;;
    *) echo "ab_session: unknown bench $w (decode, extend, indexer, prefill)" >&2; exit 2 ;;
  esac
done
