#!/usr/bin/env bash
# Session 12, call 3. From the repository root:
#   SAMU_GIT_COMMIT=<full hex> PYTHONPATH=$PWD bash results/dev/session12/scripts/call3.sh
# 1. samu bench's generation scope (the record the README's generation figures come from): the one-row products
#    with their per-shape tiles and RG-LRU's two-launch step;
# 2. samu train --preset 400m at 4 x 2048 compiled (the AdamW kernels), 100 steps, with the host's clock at every
#    step and nvidia-smi sampled every 100 ms (clocks, power, throttle reasons): are the runs' slower phases the
#    GPU's clocks or a host that falls behind?
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session12/scripts
STAGES="gen train"
. scripts/stage.sh
workspace call3.log
export W
stage gen 220 $PY -m samu.cli bench --scopes gen --shapes gen --impls auto --out "$W/bench-gen.json" --quiet 2>&1 | tail -12
save
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
stage train 150 $PY $S/optab.py s1 kernels 100 2>&1 | grep -v "^\s*$" | tail -3
kill $SMI
save
