#!/usr/bin/env bash
# Prepared in session 11 (not run: no device time left). From the repository root, with ab/split made first:
#   rm -rf ab && mkdir -p ab/split && git archive HEAD samu scripts tests pyproject.toml | tar -x -C ab/split &&
#   (cd ab/split && patch -p1 -s < ../../results/dev/session11/rglru_step_split.patch)
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session11/scripts/call5.sh
# 1. HEAD's one-row products with per-shape tiles (rowprod_triton.tiles, from session 11's call4 sweep): the decode
#    path's GPU tests, then a batch-1 decode (predicted ~0.41 ms a token for SAMU).
# 2. RG-LRU's decoding step in two launches (ab/split): its GPU tests, then decodes at batch 1 and 64 beside HEAD
#    (HEAD SPLIT SPLIT HEAD). Land the patch only if it is faster. The split tree's records carry HEAD's commit (one
#    SAMU_GIT_COMMIT for the call): their folder names (g*-split) say which tree ran.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
STAGES="tests gen"
. scripts/stage.sh
workspace call5.log
export W
stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_rowprod.py tests/models/test_generate.py \
  2>&1 | tail -3
save
(cd ab/split && PYTHONPATH=$ROOT/ab/split stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
  tests/ops/test_step.py tests/models/test_generate.py 2>&1 | tail -3)
save
gen() {  # gen TAG DIR BATCHES MIXERS
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" timeout --signal=INT --kill-after=5 90 $PY scripts/gpu_gen.py \
     --out "$W/$1" --batches $3 --mixers $4 2>&1 | grep -v "^  " | tail -6)
  save
}
gen g1-head "$ROOT" 1,64 samu,rglru
gen g2-split "$ROOT/ab/split" 1,64 rglru
gen g3-split "$ROOT/ab/split" 1,64 rglru
gen g4-head "$ROOT" 1,64 rglru
