#!/usr/bin/env bash
# Session 10, call 3: samu train's step times with the log step's values read one step later (this tree) beside
# HEAD 5406b05 (ab/prev): NEW PREV.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="train"
. scripts/stage.sh
workspace call3.log
export W
tr() {  # tr TAG DIR
  (cd "$2" && PYTHONPATH="$2" stage train 100 $PY $ROOT/ab/steptimes.py $1 base 150 2>&1 | grep -v "^\s*$" | tail -4)
  save
}
tr n1 "$ROOT"; tr p1 "$ROOT/ab/prev"
