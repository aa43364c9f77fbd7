#!/usr/bin/env bash
# Session 13, call 3 (issue 10): the model bench's side-by-side at 4 x 2048 at this code (samu's LMs and the SDPA
# transformer, eager and compiled; no flash-linear-attention wheels on this machine):
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session13/scripts/call3.sh
set -u
cd "$(dirname "$0")/../../../.."
STAGES="model2k"
. scripts/stage.sh
workspace call3.log
stage model2k 560 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 4x2048x1664 \
  --out "$W/bench-model-2k.json" --quiet 2>&1 | tail -20
save
