#!/usr/bin/env bash
# Session 10, call 1: GPU tests of the launch and no-final changes; host A/B (new launch vs HEAD); the eager block's host profile; samu train's step times and gc pauses (base, freeze).
set -u
cd "$(dirname "$0")/.."
STAGES="tests host block train"
. scripts/stage.sh
workspace call1.log
export W
ROOT=$PWD
hostab() {  # hostab TAG DIR
  (cd "$2" && PYTHONPATH="$2" stage host 45 $PY $ROOT/ab/hostab.py $1 2>&1 | tail -2)
}
stage tests 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_launch.py \
  tests/ops/test_samu_triton.py tests/ops/test_rglru_triton.py -k "launch or fp32_matches or deterministic or cuda_graph or drops_the_final or opcheck" 2>&1 | tail -4
save
hostab new1 "$ROOT"; hostab old1 "$ROOT/ab/old"; hostab new2 "$ROOT"; hostab old2 "$ROOT/ab/old"
save
stage block 60 $PY ab/blockhost.py 2>&1 | tail -3
save
for run in "b1 base" "f1 freeze"; do
  set -- $run
  stage train 140 $PY ab/steptimes.py $1 $2 150 2>&1 | grep -v "^\s*$" | tail -4
  save
done
