#!/usr/bin/env bash
# Session 12, call 4: samu train's host time per step (hostprof.py: cProfile over steps 31-60 of a 400m run at
# 4 x 2048, compiled). From the repository root:
#   SAMU_GIT_COMMIT=<full hex> PYTHONPATH=$PWD bash results/dev/session12/scripts/call4.sh
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session12/scripts
STAGES="host"
. scripts/stage.sh
workspace call4.log
export W
stage host 200 $PY $S/hostprof.py "$W/hostprof" 2>&1 | grep -v "^\s*$" | tail -22
save
