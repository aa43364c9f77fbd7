#!/usr/bin/env bash
# Session 11, call 5: the one-row products with per-shape tiles (rowprod_triton.tiles, from call4's sweep): a batch-1
# decode, then the decode path's GPU tests.
set -u
cd "$(dirname "$0")/../../../.."
STAGES="gen tests"
. scripts/stage.sh
workspace call5.log
export W
mkdir -p "$W/g1"
stage gen 60 $PY scripts/gpu_gen.py --out "$W/g1" --batches 1 --mixers samu,rglru --no-kernels 2>&1 | grep -v "^  " | tail -3
save
stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_rowprod.py tests/models/test_generate.py \
  2>&1 | tail -3
save
