#!/usr/bin/env bash
# Session 12, call 5: the clipped AdamW step with its table's fixed rows kept between steps (less host time a step).
# From the repository root:  SAMU_GIT_COMMIT=<full hex> PYTHONPATH=$PWD bash results/dev/session12/scripts/call5.sh
# 1. the GPU tests of the kernels and samu train's; 2. samu train (400m, 4 x 2048, compiled) kernels then torch,
#    100 steps each (optab.py).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session12/scripts
STAGES="tests train"
. scripts/stage.sh
workspace call5.log
export W
stage tests 110 $PY -m pytest -q -x -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_adamw.py tests/test_train.py \
  -k "adamw or clipped_step" 2>&1 | tail -3
save
for run in "k3 kernels" "t3 torch"; do
  set -- $run
  stage train 110 $PY $S/optab.py $1 $2 100 2>&1 | grep -v "^\s*$" | tail -3
  save
done
