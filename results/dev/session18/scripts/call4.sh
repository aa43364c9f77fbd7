#!/usr/bin/env bash
# Session 18, call 4 (issue 15): where a packed sequence opens found inside _chunk_cotangents, after the gate
# products, and by the packed backward's kernels only where they need the sequence index (initial states, final
# cotangents): offline, the packed weight-gradient kernel spills 220 words, not 232. h18/ = e8b9fe4's tree
# (untracked: mkdir h18 && git archive e8b9fe4 samu tests scripts | tar -x -C h18).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session18/scripts/call4.sh
# 1. bitsame_rglru.py (both variants) for h18 and HEAD at once, compared; 2. gpu_packed_profile.py (RG-LRU,
# unpacked, 16 and 256 sequences): HEAD, h18, HEAD.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
workspace call4.log
echo "=== bits (two trees at once, limit ${LIMIT:-400} s)"
pids=()
for t in h18 head; do
  root=$PWD; [ $t != head ] && root=$PWD/$t
  PYTHONPATH=$root timeout --signal=INT --kill-after=15 ${LIMIT:-400} $PY results/dev/session17/scripts/bitsame_rglru.py \
    $root $W/$t.pt > $W/bits_$t.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
$PY results/dev/session16/scripts/bitsame.py compare $W/h18.pt $W/head.pt > $W/same.txt 2>&1
echo "h18 vs head: $(tail -1 $W/same.txt)"
rm -f $W/*.pt
save
STAGES=profile
for t in head h18 head2; do
  root=$PWD; [ $t = h18 ] && root=$PWD/h18
  mkdir -p $W/prof_$t
  stage profile 110 env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --ops rglru --documents 16,256 \
    --out $W/prof_$t 2>&1 | grep "^=="
  save
done
