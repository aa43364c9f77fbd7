#!/usr/bin/env bash
# Prepared in session 12 (not run: no device time left). samu::grad_weight through torch.library's lower-level API
# (results/dev/session12/grad_weight_lib.patch): less host time a compiled step (49 calls a step for the 400m preset;
# on a CPU 17 -> 5 us a call). From the repository root, with ab/gw made first:
#   rm -rf ab && mkdir -p ab/gw && git archive HEAD samu scripts tests pyproject.toml | tar -x -C ab/gw &&
#   (cd ab/gw && patch -p1 -s < ../../results/dev/session12/grad_weight_lib.patch)
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session12/scripts/call6.sh
# 1. the patched tree's GPU tests of the linears, the compiled models and the AdamW kernels;
# 2. samu train (400m, 4 x 2048, compiled, the AdamW kernels) HEAD PATCH PATCH HEAD, 100 steps each (optab.py,
#    which records the host's clock at every step too). Land the patch only if faster.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
S=$ROOT/results/dev/session12/scripts
STAGES="tests train"
. scripts/stage.sh
workspace call6.log
export W
(cd ab/gw && PYTHONPATH=$ROOT/ab/gw stage tests 150 $PY -m pytest -q -x -p no:cacheprovider -m "gpu or not gpu" \
  tests/ops/test_linear.py tests/models/test_compile_gpu.py tests/ops/test_adamw.py 2>&1 | tail -3)
save
for run in "h1 $ROOT" "p1 $ROOT/ab/gw" "p2 $ROOT/ab/gw" "h2 $ROOT"; do
  set -- $run
  (cd "$2" && PYTHONPATH="$2" stage train 110 $PY $S/optab.py $1 kernels 100 2>&1 | grep -v "^\s*$" | tail -3)
  save
done
