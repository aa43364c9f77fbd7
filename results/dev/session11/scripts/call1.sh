#!/usr/bin/env bash
# Session 11, call 1: the GPU tests session 10 did not reach (the kernels' drops-the-final and opcheck tests, the
# training loop's GPU tests); batch-1 decoding on the one-row products (ab/rp = HEAD + results/dev/session9/rowprod.patch):
# its GPU tests, then scripts/gpu_gen.py at batch 1 as RP HEAD RP.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
STAGES="tests gen"
. scripts/stage.sh
workspace call1.log
export W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stage tests 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_samu_triton.py \
  tests/ops/test_rglru_triton.py -k "drops_the_final or opcheck" 2>&1 | tail -8
stage tests 120 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_train.py tests/ops/test_launch.py 2>&1 | tail -8
save
(cd ab/rp && PYTHONPATH=$ROOT/ab/rp stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" \
  tests/ops/test_rowprod.py tests/models/test_generate.py 2>&1 | tail -10)
save
gen() {  # gen TAG DIR
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" timeout --signal=INT --kill-after=5 50 $PY scripts/gpu_gen.py \
     --out "$W/$1" --batches 1 --mixers samu 2>&1 | tail -4)
  save
}
gen g1-rp "$ROOT/ab/rp"
gen g2-head "$ROOT"
gen g3-rp "$ROOT/ab/rp"
