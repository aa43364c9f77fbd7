#!/usr/bin/env bash
# Session 13, call 1 (issue 10): session 12's call5 and call6 in one call. From the repository root, with ab/gw made:
#   rm -rf ab && mkdir -p ab/gw && git archive HEAD samu scripts tests pyproject.toml | tar -x -C ab/gw &&
#   (cd ab/gw && patch -p1 -s < ../../results/dev/session12/grad_weight_lib.patch)
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session13/scripts/call1.sh
# 1. HEAD's GPU tests of the clipped AdamW kernels and samu train's (the fallback and unfused-state tests never ran
#    on a GPU), and the patched tree's of the linears and the compiled models;
# 2. samu train (400m, 4 x 2048, compiled, the AdamW kernels) HEAD PATCH PATCH HEAD, 100 steps each (optab.py: the
#    GPU stream's and the host's clock at every step), nvidia-smi sampled every 100 ms. Land the patch only if faster.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
S=$ROOT/results/dev/session12/scripts
STAGES="tests train"
. scripts/stage.sh
workspace call1.log
export W
stage tests 110 $PY -m pytest -q -x -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_adamw.py tests/test_train.py \
  -k "adamw or clipped_step" 2>&1 | tail -3
(cd ab/gw && PYTHONPATH=$ROOT/ab/gw stage tests 120 $PY -m pytest -q -x -p no:cacheprovider -m "gpu or not gpu" \
  tests/ops/test_linear.py tests/models/test_compile_gpu.py 2>&1 | tail -3)
save
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
for run in "h1 $ROOT" "p1 $ROOT/ab/gw" "p2 $ROOT/ab/gw" "h2 $ROOT"; do
  set -- $run
  (cd "$2" && PYTHONPATH="$2" stage train 100 $PY $S/optab.py $1 kernels 100 2>&1 | grep -v "^\s*$" | tail -3)
  save
done
kill $SMI
save
