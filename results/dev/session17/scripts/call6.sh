#!/usr/bin/env bash
# Session 17, call 6 (issue 15): the packed backward's gate-a chain kept in the scans' layout. From the repository root,
# with HEAD's tree patched, untracked, in pA/ (the layout fix alone, the recompute dropped) and pB/ (the layout fix and
# the recompute):
#   for p in A B; do mkdir p$p && git archive HEAD samu tests scripts | tar -x -C p$p; done
#   (cd pA && patch -p1 < ../results/dev/session17/patches/patchA_layout_only.diff)
#   (cd pB && patch -p1 < ../results/dev/session17/patches/patchB_layout_recompute.diff)
# then SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session17/scripts/call6.sh
# (the records of pA and pB carry HEAD's hash: they are HEAD with the patch their folder names)
# 1. packedbits.py for HEAD, pA, pB at once (compiles each tree's kernels; saves the fast variant's packed results);
# 2. pA and pB against HEAD to the bit;
# 3. gpu_packed_profile.py --ops rglru --documents 16 for HEAD, pA, pB one after another.
# Session 17 ran it with the comparison last, and the device time ran out after HEAD's profile: the saved results
# (too large to return) were lost uncompared. It now compares first; give it ~7 minutes on a fresh machine.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session17/scripts
. scripts/stage.sh
workspace call6.log
echo "=== bits (three at once, limit 200 s)"
pids=()
for t in head pA pB; do
  root=$PWD; [ $t != head ] && root=$PWD/$t
  PYTHONPATH=$root timeout --signal=INT --kill-after=10 200 $PY $S/packedbits.py $root $W/$t.pt > $W/bits_$t.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
for t in pA pB; do
  $PY results/dev/session16/scripts/bitsame.py compare $W/head.pt $W/$t.pt 2>&1 | tee $W/same_$t.txt | tail -1
done
rm -f $W/*.pt
save
for t in head pA pB; do
  root=$PWD; [ $t != head ] && root=$PWD/$t
  mkdir -p $W/prof_$t
  STAGES=profile stage profile 70 env PYTHONPATH=$root $PY $root/scripts/gpu_packed_profile.py --ops rglru --documents 16 --out $W/prof_$t 2>&1 | grep "^=="
  save
done
