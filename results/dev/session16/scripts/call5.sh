#!/usr/bin/env bash
# Session 16, call 5: the review's mends (the prefix's prefetch clamped into its span; the serial variant's one
# counter a tile), with fcfbba3's tree unpacked untracked in old16/ as for call 3. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session16/scripts/call5.sh
# 1. both SAMU variants against the previous kernels to the bit (call 3's 9 cases);
# 2. the SAMU GPU tests, with the new one (a prefix composed by whichever program arrives last).
# The call ran with the `same` stages' limits at 100 and 60 s, and the second was cut (its kernels compiled afresh);
# they are 150 s here for the rerun it owes, and the comparison is bitsame.py's own (the same code call 3 ran inline).
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session16/scripts
STAGES="${STAGES:-same tests}"
. scripts/stage.sh
workspace call5.log
OLD=$PWD/old16
stage same 150 env PYTHONPATH=$OLD $PY $S/bitsame.py $OLD $W/old.pt 2>&1 | tail -1
stage same 150 $PY $S/bitsame.py $PWD $W/new.pt 2>&1 | tail -1
$PY $S/bitsame.py compare $W/old.pt $W/new.pt 2>&1 | tee "$W/same.txt" | tail -1
rm -f $W/old.pt $W/new.pt
save
stage tests 150 $PY -m pytest -q -p no:cacheprovider --tb=short -m gpu tests/ops/test_samu_triton.py > "$W/tests.log" 2>&1
tail -3 "$W/tests.log"
save
