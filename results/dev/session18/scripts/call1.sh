#!/usr/bin/env bash
# Session 18, call 1 (issue 15). Untracked trees beside this checkout: old17/ (98732b7), pA/ and pB/ (HEAD with
# results/dev/session17/patches/patch{A_layout_only,B_layout_recompute}.diff), made as session 17's call6.sh says.
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session18/scripts/call1.sh
# bitsame_rglru.py (both variants; packed with and without states, and packed without initial states but with a
# final-state cotangent) for the four trees at once, then old17 against HEAD, HEAD against pA and against pB.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
workspace call1.log
echo "=== bits (four trees at once, limit ${LIMIT:-480} s)"
pids=()
for t in old17 head pA pB; do
  root=$PWD; [ $t != head ] && root=$PWD/$t
  PYTHONPATH=$root timeout --signal=INT --kill-after=15 ${LIMIT:-480} $PY results/dev/session17/scripts/bitsame_rglru.py \
    $root $W/$t.pt > $W/bits_$t.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
for pair in "old17 head" "head pA" "head pB"; do
  set -- $pair
  $PY results/dev/session16/scripts/bitsame.py compare $W/$1.pt $W/$2.pt > $W/same_$1_$2.txt 2>&1
  echo "$1 vs $2: $(tail -1 $W/same_$1_$2.txt)"
done
rm -f $W/*.pt
save
