#!/usr/bin/env bash
# One device call: SAMU v3.6 (per-token mode sums across the warp, not through the slot; this tree, uncommitted)
# timed beside OLD = c64c582's kernels (NEW OLD NEW), Nsight Compute on its main backward, GPU tests of it and
# of the one-product embedding gradient, and `samu train` profiled with that embedding.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="tests prof ncu train"
. scripts/stage.sh
workspace call5.log
export SAMU_GIT_COMMIT=$(cat ab/NEWC)
export W
stage tests 100 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_embedding.py \
  tests/ops/test_samu_triton.py -k "embedding or fp32_matches or deterministic_bits or packed_kernels_pass or main_tile"
save
prof() {  # prof TAG DIR
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" timeout --signal=INT --kill-after=10 60 $PY scripts/gpu_profile.py \
     --shapes "1,32768,2048;4,2048,2048;1,8192,1024" --out "$W/$1" 2>&1 | grep -E "fb graph|_main_kernel|_dx_kernel")
  save
}
prof p1-new "$ROOT"
prof p2-old "$ROOT/ab/old"
prof p3-new "$ROOT"
stage ncu 60 env OUT="$W" bash scripts/gpu_ncu.sh samu triton_grouped 1,32768,2048 _main_kernel
save
stage train 110 $PY ab/trainprof.py det2
save
