#!/usr/bin/env bash
# Session 14, call 3 (issue 11, exploratory). From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session14/scripts/call3.sh
# The decode's chain of 48 products (12 layers of the 400m preset) in a CUDA graph at M = 1, 8, 64 rows, alone and
# with the next product's weights prefetched into L2 from a parallel branch (prefetch.py).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session14/scripts
STAGES="prefetch"
. scripts/stage.sh
workspace call3.log
stage prefetch 150 $PY $S/prefetch.py 1,8,64 2>&1 | tail -12
save
