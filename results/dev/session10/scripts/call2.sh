#!/usr/bin/env bash
# Session 10, call 2: per-kernel profiles of both mixers unpacked and packed (16, 256) at (1, 32768, 2048), this tree
# (the forward skips the final state a caller drops) beside ab/old (983cc86), NEW OLD; gates in both calls (bf16,
# two shapes, and packed); the model bench at 4 x 2048.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="profile gates model2k"
. scripts/stage.sh
workspace call2.log
export W
prof() {  # prof TAG DIR
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" stage profile 100 $PY scripts/gpu_packed_profile.py --out "$W/$1" 2>&1 | grep -E "===|ms|_kernel" | head -60)
  save
}
prof p1-new "$ROOT"
prof p2-old "$ROOT/ab/old"
stage gates 150 $PY -m samu.cli gate --ops samu,rglru --shapes 1x32768x1024,4x2048x1664 --dtypes bfloat16 \
  --backends variants --out "$W/gates-both-calls.json" --no-status 2>&1 | tail -12
save
stage model2k 130 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 4x2048x1664 \
  --out "$W/bench-model-2k.json" --quiet
save
stage gates 90 $PY -m samu.cli gate --ops samu,rglru --shapes 1x32768x1024 --dtypes bfloat16 --documents 16 \
  --backends variants --out "$W/gates-both-calls-packed.json" --no-status 2>&1 | tail -8
save
