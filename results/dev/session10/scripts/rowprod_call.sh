#!/usr/bin/env bash
# Prepared in session 10 (not run: no device time left): batch-1 decoding on the one-row products (ab/rp = HEAD + results/dev/session9/rowprod.patch):
# its GPU tests, then scripts/gpu_gen.py at batch 1 as RP HEAD RP; then the model bench at 4 x 2048; gates in both backward forms (bf16, two shapes, and packed).
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="tests gen model2k gates"
. scripts/stage.sh
workspace call2.log
export W
(cd ab/rp && PYTHONPATH=$ROOT/ab/rp stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
  tests/ops/test_rowprod.py tests/models/test_generate.py 2>&1 | tail -15)
save
gen() {  # gen TAG DIR
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" timeout --signal=INT --kill-after=5 45 $PY scripts/gpu_gen.py \
     --out "$W/$1" --batches 1 --mixers samu 2>&1 | tail -4)
  save
}
gen g1-rp "$ROOT/ab/rp"
gen g2-head "$ROOT"
gen g3-rp "$ROOT/ab/rp"
stage gates 150 $PY -m samu.cli gate --ops samu,rglru --shapes 1x32768x1024,4x2048x1664 --dtypes bfloat16 \
  --backends variants --out "$W/gates-both-forms.json" --no-status 2>&1 | tail -12
save
stage model2k 130 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 4x2048x1664 \
  --out "$W/bench-model-2k.json" --quiet
save
stage gates 90 $PY -m samu.cli gate --ops samu,rglru --shapes 1x32768x1024 --dtypes bfloat16 --documents 16 \
  --backends variants --out "$W/gates-both-forms-packed.json" --no-status 2>&1 | tail -8
save
