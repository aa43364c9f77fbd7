#!/usr/bin/env bash
# Session 17, call 3 (issue 15). As call 2 (old17/ = 98732b7's tree, untracked):
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session17/scripts/call3.sh
# 1. same: bitsame_rglru.py for old17 and this tree (the recompute now skipped by the precise variant), compared;
# 2. tests: scripts/gpu_packed.sh's tests stage (every packing test on the GPU).
# Call 3 ran both stages with the 240 s limit, which cut the comparison (a fresh machine compiles both trees) and
# the first tests stage; call 4 is this script with STAGES=same LIMIT=450.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session17/scripts
STAGES="${STAGES:-same tests}"
. scripts/stage.sh
workspace call3.log
if [[ " $STAGES " == *" same "* ]]; then
  echo "=== same (limit ${LIMIT:-240}s each, two at once)"
  PYTHONPATH=$PWD/old17 timeout --signal=INT --kill-after=15 ${LIMIT:-240} $PY $S/bitsame_rglru.py $PWD/old17 $W/o17.pt > $W/same_o17.log 2>&1 &
  p1=$!
  timeout --signal=INT --kill-after=15 ${LIMIT:-240} $PY $S/bitsame_rglru.py $PWD $W/new.pt > $W/same_new.log 2>&1 &
  p2=$!
  wait $p1; wait $p2
  $PY results/dev/session16/scripts/bitsame.py compare $W/o17.pt $W/new.pt 2>&1 | tee "$W/same.txt" | tail -1
  rm -f $W/*.pt
  save
fi
stage tests 150 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_packing.py \
  tests/ops/test_glue.py tests/models/test_generate.py -k "packed or pack or different_lengths" > "$W/tests1.log" 2>&1
tail -2 "$W/tests1.log"
stage tests 150 $PY -m pytest -q -p no:cacheprovider --tb=short tests/ops/test_samu_triton.py tests/ops/test_rglru_triton.py \
  tests/modules/test_compile.py -k packed > "$W/tests2.log" 2>&1
tail -2 "$W/tests2.log"
save
