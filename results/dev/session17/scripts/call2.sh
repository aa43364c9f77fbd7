#!/usr/bin/env bash
# Session 17, call 2 (issue 15). From the repository root, with 98732b7's tree unpacked, untracked, in old17/
# (git archive 98732b7 samu tests scripts | tar -x -C old17), then
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session17/scripts/call2.sh
# 1. same: bitsame_rglru.py (9 cases, packed and not) for old17 and this tree at once, compared;
# 2. profile: scripts/gpu_packed_profile.py --ops rglru at (1, 32768, 2048), unpacked and 16 sequences, old17 then
#    this tree then old17 again;
# 3. tests: the RG-LRU GPU tests of packed calls (`-m gpu -k packed` selected none; call 3 ran them).
# As run, each profile's output went through `head -12`, which cut the packed lines from call2.log (the JSON records
# are complete); it now keeps the summary lines only. old17's runs now set their own SAMU_GIT_COMMIT (in call 2's
# records, git_commit is the call's for every run).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session17/scripts
STAGES="${STAGES:-same profile tests}"
. scripts/stage.sh
workspace call2.log
if [[ " $STAGES " == *" same "* ]]; then
  echo "=== same (limit 240s each, two at once)"
  SAMU_GIT_COMMIT=98732b723b75cd5fef16b3f0285ff11f0d03add6 PYTHONPATH=$PWD/old17 timeout --signal=INT --kill-after=15 240 $PY $S/bitsame_rglru.py $PWD/old17 $W/o17.pt > $W/same_o17.log 2>&1 &
  p1=$!
  timeout --signal=INT --kill-after=15 240 $PY $S/bitsame_rglru.py $PWD $W/new.pt > $W/same_new.log 2>&1 &
  p2=$!
  wait $p1; wait $p2
  $PY results/dev/session16/scripts/bitsame.py compare $W/o17.pt $W/new.pt 2>&1 | tee "$W/same.txt" | tail -1
  rm -f $W/*.pt
  save
fi
for run in o17 new o17b; do
  mkdir -p $W/prof_$run
  if [ $run = new ]; then
    stage profile 150 $PY scripts/gpu_packed_profile.py --ops rglru --documents 16 --out $W/prof_$run 2>&1 | grep "^=="
  else
    stage profile 150 env SAMU_GIT_COMMIT=98732b723b75cd5fef16b3f0285ff11f0d03add6 PYTHONPATH=$PWD/old17 $PY old17/scripts/gpu_packed_profile.py --ops rglru --documents 16 --out $W/prof_$run 2>&1 | grep "^=="
  fi
  save
done
stage tests 200 $PY -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/ops/test_rglru_triton.py -k packed > "$W/tests.log" 2>&1
tail -3 "$W/tests.log"
save
