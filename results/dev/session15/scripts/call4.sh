#!/usr/bin/env bash
# Session 15, call 4: call3's split runs, which failed (sumtab.py's replacement looked a global up in a __main__
# that runpy had replaced), as one split and one fused run on one machine. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session15/scripts/call4.sh
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session15/scripts
STAGES="train"
. scripts/stage.sh
workspace call4.log
for run in "s3 split" "f3 fused"; do
  set -- $run
  stage train 95 $PY $S/sumtab.py $1 $2 100 2>&1 | grep -v "^\s*$" | tail -3
  save
done
