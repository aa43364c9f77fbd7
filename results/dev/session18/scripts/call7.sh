#!/usr/bin/env bash
# Session 18, call 7 (issue 15): a chunk's opening bits and the next chunk's first one held as one 64-bit word
# (packing_triton.chunk_bits), so a packed walk tests a token with one shift: offline, SAMU's packed dx kernel
# 182 -> 128 registers. h18b/ = 3f2631a's tree (untracked: git archive 3f2631a samu tests scripts | tar -x -C h18b).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session18/scripts/call7.sh
# 1. bits: bitsame_samu.py and bitsame_rglru.py for h18b and HEAD, four processes at once, compared;
# 2. gpu_packed_profile.py (both mixers; unpacked, 16 and 256 sequences): HEAD, then h18b.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session18/scripts
. scripts/stage.sh
workspace call7.log
echo "=== bits (limit ${LIMIT:-260} s)"
pids=()
for t in h18b head; do
  root=$PWD; [ $t != head ] && root=$PWD/$t
  for op in samu rglru; do
    script=$S/bitsame_samu.py; [ $op = rglru ] && script=results/dev/session17/scripts/bitsame_rglru.py
    PYTHONPATH=$root timeout --signal=INT --kill-after=15 ${LIMIT:-260} $PY $script $root $W/${op}_$t.pt \
      > $W/bits_${op}_$t.log 2>&1 &
    pids+=($!)
  done
done
for p in "${pids[@]}"; do wait $p; done
for op in samu rglru; do
  $PY results/dev/session16/scripts/bitsame.py compare $W/${op}_h18b.pt $W/${op}_head.pt > $W/same_$op.txt 2>&1
  echo "$op h18b vs head: $(tail -1 $W/same_$op.txt)"
done
rm -f $W/*.pt
save
STAGES=profile
for t in head h18b; do
  root=$PWD; [ $t = h18b ] && root=$PWD/h18b
  mkdir -p $W/prof_$t
  stage profile 80 env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --documents 16,256 \
    --out $W/prof_$t 2>&1 | grep "^=="
  save
done
