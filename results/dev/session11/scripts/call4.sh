#!/usr/bin/env bash
# Session 11, call 4: the one-row products' tiles again (rowsweep.py now captures a fresh graph for every config;
# call3's reused the first); the rest of SAMU's gates in both calls (fp16 and fp32; call3 finished bf16 and part
# of fp16 before its time limit).
set -u
cd "$(dirname "$0")/../../../.."
STAGES="sweep gates"
. scripts/stage.sh
workspace call4.log
export W
stage sweep 250 $PY results/dev/session11/scripts/rowsweep.py "$W" 2>&1 | tail -45
save
stage gates 250 $PY -m samu.cli gate --ops samu --quiet --no-status --backends triton_grouped,triton_serial --shapes gate \
  --dtypes fp16,fp32 --out "$W/gates-samu-fp16-fp32.json" 2>&1 | tail -4
save
