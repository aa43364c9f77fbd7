#!/usr/bin/env bash
# Session 16, call 2 (issue 12: SAMU's prefix inside the summary kernels, 12 -> 8 launches a forward + backward).
# From the repository root, with the session's first commit (fcfbba3, the kernels before) as the device's HEAD:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session16/scripts/call2.sh
# 1. outputs and gradients of both SAMU variants at 9 cases, old tree against new, to the bit;
# 2. the SAMU GPU tests (tests/ops/test_samu_triton.py, -m gpu);
# 3. scripts/gpu_profile.py, old, new, old, new (graph time, host time, kernel table).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session16/scripts
STAGES="${STAGES:-same tests profile}"
. scripts/stage.sh
workspace call2.log
OLD=/tmp/old
rm -rf $OLD && mkdir -p $OLD && git archive fcfbba31d3fcd17b2b6f947a0d143c2265dfb716 samu tests scripts | tar -x -C $OLD
stage same 120 env PYTHONPATH=$OLD $PY $S/bitsame.py $OLD $W/old.pt 2>&1 | tail -2
stage same 120 $PY $S/bitsame.py $PWD $W/new.pt 2>&1 | tail -2
$PY - "$W" <<'PYEOF' 2>&1 | tee "$W/same.txt"
import sys, torch
a, b = torch.load(f"{sys.argv[1]}/old.pt"), torch.load(f"{sys.argv[1]}/new.pt")
bad = 0
for k in a:
    same = k in b and all(torch.equal(u, v) for u, v in zip(a[k], b[k])) and len(a[k]) == len(b[k])
    bad += not same
    print(("same  " if same else "DIFF  ") + k)
print(f"{len(a) - bad} of {len(a)} cases equal to the bit ({len(b)} new)")
PYEOF
rm -f $W/old.pt $W/new.pt
save
stage tests 150 $PY -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/ops/test_samu_triton.py > "$W/tests.log" 2>&1
tail -3 "$W/tests.log"
save
for run in old new old2 new2; do
  mkdir -p $W/prof_$run
  if [ "${run:0:3}" = old ]; then
    stage profile 75 env PYTHONPATH=$OLD $PY $OLD/scripts/gpu_profile.py --op samu --shapes "1,8192,1024;4,2048,2048;1,32768,2048" --out $W/prof_$run 2>&1 | grep "fb " | tail -3
  else
    stage profile 75 $PY scripts/gpu_profile.py --op samu --shapes "1,8192,1024;4,2048,2048;1,32768,2048" --out $W/prof_$run 2>&1 | grep "fb " | tail -3
  fi
  save
done
