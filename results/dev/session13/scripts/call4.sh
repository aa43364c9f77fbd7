#!/usr/bin/env bash
# Session 13, call 4 (issue 10): call 1's first test command again, with tracebacks (in call 1 one test failed
# there, the clipped-AdamW train test, 10th of the run; alone, in call 2, it passed, as it was and as it is now).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session13/scripts/call4.sh
set -u
cd "$(dirname "$0")/../../../.."
STAGES="tests"
. scripts/stage.sh
workspace call4.log
for i in 1 2; do
  stage tests 100 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_adamw.py \
    tests/test_train.py -k "adamw or clipped_step" 2>&1 | grep -v "^\s*$" | tail -40
done
save
