#!/usr/bin/env bash
# Session 17, call 1 (issue 12). From the repository root, with two older trees unpacked, untracked:
#   old16/ = fcfbba3 (before session 16's prefix), old17/ = 98732b7 (session 16's last commit)
#   (git archive C samu tests scripts | tar -x -C DIR), then
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session17/scripts/call1.sh
# 1. same: bitsame.py (session 16's 9 cases, both SAMU variants) for old16, old17, this tree, and this tree under
#    three register caps (CAP_<kernel> = ptxas maxnreg for the summary, replay, adjoint-summary and dx kernels), six
#    processes at once (their compiles run in parallel; the outputs are deterministic); each compared with old16.
#    old17 against old16 is session 16's owed comparison; the caps change no arithmetic, so they must match too;
# 2. profile: scripts/gpu_profile.py at three shapes for old17, this tree, and the three caps, one after another.
# It measures what it says only at 63b7480, whose launches read the CAP_* variables (the hook was removed after this
# call: at later commits B, C and D run the shipped kernels). The profile records' git_commit field is the call's
# SAMU_GIT_COMMIT even for old17's run (98732b7's tree); o17's runs now set their own.
set -u
cd "$(dirname "$0")/../../../.."
S16=results/dev/session16/scripts
STAGES="${STAGES:-same profile}"
. scripts/stage.sh
workspace call1.log
capB="CAP_summary_kernel=80 CAP_replay_kernel=72 CAP_adjoint_summary_kernel=80 CAP_dx_kernel=104"
capC="CAP_summary_kernel=72 CAP_replay_kernel=64 CAP_adjoint_summary_kernel=72 CAP_dx_kernel=96"
capD="CAP_summary_kernel=64 CAP_replay_kernel=64 CAP_adjoint_summary_kernel=64 CAP_dx_kernel=80"
if [[ " $STAGES " == *" same "* ]]; then
  echo "=== same (limit 240s each, six at once)"
  pids=()
  for run in o16 o17 new B C D; do
    case $run in
      o16) root=$PWD/old16; env_=() ;;
      o17) root=$PWD/old17; env_=() ;;
      new) root=$PWD; env_=() ;;
      B) root=$PWD; env_=($capB) ;;
      C) root=$PWD; env_=($capC) ;;
      D) root=$PWD; env_=($capD) ;;
    esac
    env "${env_[@]}" PYTHONPATH=$root timeout --signal=INT --kill-after=15 240 \
      $PY $S16/bitsame.py $root $W/$run.pt > $W/same_$run.log 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait $p; done
  for run in o17 new B C D; do
    echo "--- $run against o16"
    $PY $S16/bitsame.py compare $W/o16.pt $W/$run.pt 2>&1 | tee "$W/same_${run}.txt" | tail -1
  done
  rm -f $W/*.pt
  save
fi
SH="1,8192,1024;4,2048,2048;1,32768,2048"
for run in o17 new B C D; do
  mkdir -p $W/prof_$run
  case $run in
    o17) stage profile 120 env PYTHONPATH=$PWD/old17 SAMU_GIT_COMMIT=98732b723b75cd5fef16b3f0285ff11f0d03add6 $PY old17/scripts/gpu_profile.py --op samu --shapes "$SH" --out $W/prof_$run 2>&1 | grep "fb " | tail -3 ;;
    new) stage profile 120 $PY scripts/gpu_profile.py --op samu --shapes "$SH" --out $W/prof_$run 2>&1 | grep "fb " | tail -3 ;;
    B) stage profile 120 env $capB $PY scripts/gpu_profile.py --op samu --shapes "$SH" --out $W/prof_$run 2>&1 | grep "fb " | tail -3 ;;
    C) stage profile 120 env $capC $PY scripts/gpu_profile.py --op samu --shapes "$SH" --out $W/prof_$run 2>&1 | grep "fb " | tail -3 ;;
    D) stage profile 120 env $capD $PY scripts/gpu_profile.py --op samu --shapes "$SH" --out $W/prof_$run 2>&1 | grep "fb " | tail -3 ;;
  esac
  save
done
$PY results/dev/session17/scripts/proftab.py $W 2>&1 | tee $W/proftab.txt
save
