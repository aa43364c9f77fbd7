#!/usr/bin/env bash
# Session 11, call 3: the batch-1 decode with RG-LRU's step back without PDL (this tree); the one-row products' tiles
# per product shape (rowsweep.py); SAMU's variants gated in both calls (the usual one and training's) at every gate
# shape and dtype, and packed.
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
STAGES="gen sweep gates"
. scripts/stage.sh
workspace call3.log
export W
mkdir -p "$W/g1"
stage gen 60 $PY scripts/gpu_gen.py --out "$W/g1" --batches 1 --mixers samu,rglru --no-kernels 2>&1 | grep -v "^  " | tail -3
save
stage sweep 330 $PY results/dev/session11/scripts/rowsweep.py "$W" 2>&1 | tail -60
save
stage gates 200 $PY -m samu.cli gate --ops samu --quiet --no-status --backends triton_grouped,triton_serial --shapes gate \
  --dtypes bf16,fp16,fp32 --out "$W/gates-samu.json" 2>&1 | tail -6
save
stage gates 60 $PY -m samu.cli gate --ops samu --quiet --no-status --backends triton_grouped,triton_serial --shapes packed \
  --dtypes bf16,fp32 --documents 16 --out "$W/gates-samu-packed.json" 2>&1 | tail -4
save
