#!/usr/bin/env bash
# One device call (session 9, call 5): batch-1 decoding on one-row products (this commit) on the GPU: its tests,
# then scripts/gpu_gen.py at batch 1 beside OLD = b3a6b70 (ab/old), NEW OLD NEW.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="tests gen"
. scripts/stage.sh
workspace call5.log
NEWC=$(cat ab/NEWC)
export W SAMU_GIT_COMMIT=$NEWC
stage tests 90 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_rowprod.py \
  tests/models/test_generate.py
save
gen() {  # gen TAG DIR COMMIT
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" SAMU_GIT_COMMIT="$3" timeout --signal=INT --kill-after=5 40 $PY scripts/gpu_gen.py \
     --out "$W/$1" --batches 1 --mixers samu 2>&1 | tail -4)
  save
}
gen g1-new "$ROOT" "$NEWC"
gen g2-old "$ROOT/ab/old" b3a6b70
gen g3-new "$ROOT" "$NEWC"
