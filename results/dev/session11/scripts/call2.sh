#!/usr/bin/env bash
# Session 11, call 2: decoding with PDL steps and prefetched row-product tiles (this tree, NEW) beside the one-row
# products as session 10 prepared them (ab/rp = 821d8c0 + results/dev/session9/rowprod.patch, RP) and 821d8c0 (ab/head,
# HEAD): GPU tests of the decode path, then scripts/gpu_gen.py.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
STAGES="tests gen"
. scripts/stage.sh
workspace call2.log
export W
stage tests 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_rowprod.py tests/ops/test_step.py \
  tests/models/test_generate.py 2>&1 | tail -6
save
gen() {  # gen TAG DIR BATCHES MIXERS
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" timeout --signal=INT --kill-after=5 90 $PY scripts/gpu_gen.py \
     --out "$W/$1" --batches $3 --mixers $4 2>&1 | grep -v "^  " | tail -12)
  save
}
gen g1-new "$ROOT" 1 samu,rglru
gen g2-rp "$ROOT/ab/rp" 1 samu,rglru
gen g3-new "$ROOT" 1 samu,rglru
gen g4-rp "$ROOT/ab/rp" 1 samu,rglru
gen g5-new "$ROOT" 8,64 samu,rglru
gen g6-head "$ROOT/ab/head" 8,64 samu,rglru
