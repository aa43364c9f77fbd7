#!/usr/bin/env bash
# Session 12, call 2: the clipped AdamW kernels (samu.ops.adamw). From the repository root:
#   SAMU_GIT_COMMIT=<full hex> PYTHONPATH=$PWD bash results/dev/session12/scripts/call2.sh
# 1. their GPU tests and samu train's (tiny runs on CUDA: alike, resumed exactly);
# 2. the optimizer step alone for the 400m preset, torch's path against the kernels (optbench.py);
# 3. samu train --preset 400m at 4 x 2048 compiled, 80 steps, kernels / torch / torch / kernels (optab.py).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session12/scripts
STAGES="tests bench train"
. scripts/stage.sh
workspace call2.log
export W
stage tests 130 $PY -m pytest -q -x -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_adamw.py tests/test_train.py \
  -k "adamw or clipped_step or resume_continues_exactly" 2>&1 | tail -4
save
stage bench 60 $PY $S/optbench.py "$W/optbench.json" 2>&1 | tail -4
save
for run in "k1 kernels" "t1 torch" "t2 torch" "k2 kernels"; do
  set -- $run
  stage train 100 $PY $S/optab.py $1 $2 80 2>&1 | grep -v "^\s*$" | tail -3
  save
done
