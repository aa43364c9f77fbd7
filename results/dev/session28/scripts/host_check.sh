#!/usr/bin/env bash
# For the next device session (written in session 28, not yet run): session 28's host changes (be6b7f3, 53004a7:
# the remembered dispatch choice, scratch carved from one allocation, RG-LRU's backward on the forward's split
# weights) have run on no GPU. From the repository root, with the tree before unpacked beside it
# (`git archive a80780c samu tests scripts pyproject.toml | tar -x -C old28`, untracked; delete it before committing):
#   OLD=old28 STAGES="tests memcheck" OUT=$OUT bash results/dev/session28/scripts/host_check.sh   (~8 minutes)
#   OLD=old28 STAGES="mems hosts" OUT=$OUT bash results/dev/session28/scripts/host_check.sh       (~7 minutes)
# tests: every test of both mixers' kernels on CUDA, the interpreter's cases too (their NaN-poisoned scratch), in two
# processes. memcheck: the same files' cases under compute-sanitizer until its limit. mems: `samu bench --scopes fb` at
# (1, 32768, 2048) on both trees (peak_alloc / peak_reserved: one scratch block instead of 10-16). hosts: the host's
# time piece by piece (hostparts.py) on both trees, old new new old, one machine.
set -u
: "${OLD:?OLD must name the tree before, unpacked}"
. scripts/stage.sh
workspace host_check.log
export SAMU_AUTO_GATE=0 SAMU_GATE_STATUS=$PWD/samu/gates/status.json
HERE=$PWD
both_tests() {
  timeout 280 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" -rfEs --tb=short tests/ops/test_samu_triton.py \
    > $W/samu_tests.log 2>&1 &
  local p1=$!
  timeout 280 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" -rfEs --tb=short tests/ops/test_rglru_triton.py \
    tests/ops/test_dispatch.py tests/ops/test_triton_utils.py > $W/rglru_tests.log 2>&1 &
  local p2=$!
  wait $p1; local r1=$?
  wait $p2; local r2=$?
  tail -n 2 $W/samu_tests.log $W/rglru_tests.log
  return $((r1 || r2))
}
memcheck() {
  timeout --signal=INT 190 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m pytest -q -x -p no:cacheprovider \
    tests/ops/test_samu_triton.py tests/ops/test_rglru_triton.py > $W/memcheck.log 2>&1
  local rc=$?
  grep -E "ERROR SUMMARY|passed|failed" $W/memcheck.log | tail -n 3
  return $rc
}
mem() {   # tree name
  (cd $1 && PYTHONPATH=$PWD timeout 55 $PY -m samu.bench bench --scopes fb --shapes 1x32768x2048 --peers none --quiet \
    --out $W/mem_$2.json > $W/mem_$2.log 2>&1; tail -n 4 $W/mem_$2.log)
}
mems() { mem $OLD old && mem $HERE new; }
host() {  # tree name
  (cd $1 && PYTHONPATH=$PWD OUT=$W/host_$2 timeout 80 $PY $HERE/results/dev/session28/scripts/hostparts.py \
    > $W/host_$2.log 2>&1; grep -E "choose|fwd\+bwd eager|backward\(\) alone" $W/host_$2.log | sed "s/^/$2 /")
}
hosts() { mkdir -p $W/host_old1 $W/host_new1 $W/host_new2 $W/host_old2
  host $OLD old1; host $HERE new1; host $HERE new2; host $OLD old2; }
# stages by name (scripts/stage.sh's `stage` times a command, not a function: each function holds its own limits)
run_stage() {
  case " ${STAGES:-} " in *" $1 "*) ;; *) return 0 ;; esac
  echo "=== $1"
  $1
  echo "=== $1: exit $?"
  save
}
tests() { both_tests; }
run_stage tests
run_stage memcheck
run_stage mems
run_stage hosts
