#!/usr/bin/env bash
# Prepared in session 11 (not run): can a Triton tensor-core product of 64 rows beat cuBLAS's in the batch-64 decode?
# rows_tc.py times each of the 400m preset's four product shapes as a chain of 12 weight matrices in a CUDA graph (L2
# flushed), cuBLAS against 24 configs of a pipelined Triton product (~5 minutes).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session11/scripts/call6.sh
set -u
cd "$(dirname "$0")/../../../.."
STAGES="rows"
. scripts/stage.sh
workspace call6.log
export W
stage rows 400 $PY results/dev/session11/scripts/rows_tc.py 64 2>&1 | tail -40
save
