#!/usr/bin/env bash
# Session 16, call 4: plan items left from session 15. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session16/scripts/call4.sh
# 1. Nsight Compute on RG-LRU's weight-gradient kernel at (1, 32768, 2048) (issue 13);
# 2. a fresh profile of the samu train step (400m, 4 x 2048, compiled; session 8's trainprof.py) (issue 10).
set -u
cd "$(dirname "$0")/../../../.."
STAGES="${STAGES:-ncu prof}"
. scripts/stage.sh
workspace call4.log
stage ncu 240 env OUT=$W bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel 2>&1 | tail -4
rm -f $W/ncu/*.ncu-rep $W/ncu.tar.gz
save
stage prof 150 $PY results/dev/session8/scripts/trainprof.py p16 2>&1 | grep -v "^\s*$" | tail -25
save
