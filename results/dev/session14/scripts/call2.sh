#!/usr/bin/env bash
# Session 14, call 2. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session14/scripts/call2.sh
# 1. issue 10: samu train (400m, 4 x 2048, compiled) HEAD / Inductor CUDA graphs / graphs / HEAD, 100 steps each
#    (session 12's optab.py: the GPU stream's time at every step), nvidia-smi beside;
# 2. issue 13: the cuBLAS products of an RG-LRU built from products and elementwise passes (gemmdesign.py).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session14/scripts
STAGES="train gemm"
. scripts/stage.sh
workspace call2.log
stage gemm 60 $PY $S/gemmdesign.py 2>&1 | tail -12
save
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
for run in "h1 results/dev/session12/scripts/optab.py h1 kernels" "g1 $S/cgtab.py g1" "g2 $S/cgtab.py g2" \
    "h2 results/dev/session12/scripts/optab.py h2 kernels"; do
  set -- $run
  shift
  stage train 110 $PY "$@" 100 2>&1 | grep -v "^\s*$" | tail -15
  save
done
kill $SMI
save
