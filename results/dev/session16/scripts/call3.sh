#!/usr/bin/env bash
# Session 16, call 3. From the repository root, with the tree of fcfbba3 (the kernels before) unpacked, untracked,
# in old16/ (git archive fcfbba3 samu tests scripts | tar -x -C old16):
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session16/scripts/call3.sh
# 1. call 2's comparison to the bit (whose old tree was missing there): both SAMU variants at 9 cases;
# 2. scripts/gpu_profile.py old then new (host time A/B in one call);
# 3. issue 10: call 1's missing runs, f0 (fused, seed 0, cut at step 380 there) and s2 (split, seed 2), 500 steps.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session16/scripts
STAGES="${STAGES:-same profile train}"
. scripts/stage.sh
workspace call3.log
OLD=$PWD/old16
stage same 120 env PYTHONPATH=$OLD $PY $S/bitsame.py $OLD $W/old.pt 2>&1 | tail -1
stage same 120 $PY $S/bitsame.py $PWD $W/new.pt 2>&1 | tail -1
$PY - "$W" <<'PYEOF' 2>&1 | tee "$W/same.txt"
import sys, torch
a, b = torch.load(f"{sys.argv[1]}/old.pt"), torch.load(f"{sys.argv[1]}/new.pt")
bad = 0
for k in a:
    same = k in b and len(a[k]) == len(b[k]) and all(torch.equal(u, v) for u, v in zip(a[k], b[k]))
    bad += not same
    print(("same  " if same else "DIFF  ") + k)
print(f"{len(a) - bad} of {len(a)} cases equal to the bit ({len(b)} new)")
PYEOF
rm -f $W/old.pt $W/new.pt
save
for run in old new; do
  mkdir -p $W/prof_$run
  if [ $run = old ]; then
    stage profile 60 env PYTHONPATH=$OLD $PY $OLD/scripts/gpu_profile.py --op samu --shapes "1,8192,1024;4,2048,2048;1,32768,2048" --out $W/prof_$run 2>&1 | grep "fb " | tail -3
  else
    stage profile 60 $PY scripts/gpu_profile.py --op samu --shapes "1,8192,1024;4,2048,2048;1,32768,2048" --out $W/prof_$run 2>&1 | grep "fb " | tail -3
  fi
  save
done
for run in "f0 fused 0" "s2 split 2"; do
  set -- $run
  stage train 100 $PY $S/qualtab.py $1 $2 $3 500 2>&1 | grep -v "^\s*$" | tail -1
  save
done
