#!/usr/bin/env bash
# One device call: `samu train` 400m compiled with steps 31-35 profiled, deterministic (default) and not.
set -u
cd "$(dirname "$0")/.."
STAGES="prof"
. scripts/stage.sh
workspace call4.log
export SAMU_GIT_COMMIT=$(cat ab/NEWC)
export W
stage prof 200 $PY ab/trainprof.py det
save
stage prof 150 $PY ab/trainprof.py nodet --no-deterministic
save
