#!/usr/bin/env bash
# Session 18, call 2 (issue 15): gpu_packed_profile.py (RG-LRU; unpacked, 16 and 256 sequences) for HEAD, pA, pB,
# then HEAD again (the trees as call1.sh says).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session18/scripts/call2.sh
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
workspace call2.log
STAGES=profile
for t in head pA pB head2; do
  root=$PWD; case $t in pA|pB) root=$PWD/$t ;; esac
  mkdir -p $W/prof_$t
  stage profile ${LIMIT:-110} env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --ops rglru \
    --documents 16,256 --out $W/prof_$t 2>&1 | grep "^=="
  save
done
