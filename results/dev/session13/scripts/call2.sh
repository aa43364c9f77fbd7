#!/usr/bin/env bash
# Session 13, call 2. From the repository root, with ab/orig made from aa5e857 (session 13's first commit):
#   rm -rf ab && mkdir -p ab/orig && git archive aa5e857 samu scripts tests pyproject.toml | tar -x -C ab/orig
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session13/scripts/call2.sh
# 1. issue 10: the train test that failed in call 1, as it was (ab/orig) and as it is at HEAD, with its traceback;
# 2. issue 11: eager decoding steps' host time (eagerprof.py, batch 1 and 64, both mixers, cProfile);
# 3. issue 11: session 11's rows_tc.py (64 rows: cuBLAS against a pipelined Triton tensor-core product, ~5 min).
set -u
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
S=$ROOT/results/dev/session13/scripts
STAGES="tests eager rows"
. scripts/stage.sh
workspace call2.log
export W
(cd ab/orig && PYTHONPATH=$ROOT/ab/orig stage tests 80 $PY -m pytest -q -p no:cacheprovider --tb=short \
  tests/test_train.py -k train_alike 2>&1 | grep -v "^\s*$" | tail -30)
stage tests 80 $PY -m pytest -q -p no:cacheprovider --tb=short tests/test_train.py -k train_alike 2>&1 | tail -15
save
stage eager 120 $PY $S/eagerprof.py 1,64 2>&1 | tail -6
save
stage rows 380 $PY results/dev/session11/scripts/rows_tc.py 64 2>&1 | tail -40
save
