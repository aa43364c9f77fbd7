#!/usr/bin/env bash
# For the next device session (written in session 25, not yet run: no device was lent): SAMU's mode table
# (patches/mode_table.diff) judged in one call. The patch moves the walks' float64 per-mode constants (exp nu, cos and
# sin of theta as fp32 hi/lo pairs) out of four kernels' prologues into one evaluation a call (the forward's controller
# kernel; in the backward the adjoint summaries, which keep theirs, write the table), so the summary, replay, main
# backward and dx kernels load a [5, N] table instead. The same bits in Triton's interpreter (16 cases,
# scripts/interp_bits.py); this call checks them on the H200 against the tree before (scripts/gpu_bits.sh, its cases
# with a (2, 40, 2048) one, where the forward controller's loop over modes runs twice), times both trees alternating
# (gpu_change.sh's profile stage: this, the tree before, this), then a third tree once, with the grouped summary held
# to 80 registers (patches/summary_cap80.diff: 95 uncapped, offline).
#
# Prepare here (the trees travel; the device's .git may lack these commits, so pass their literal hashes):
#   PREV=$(git rev-parse HEAD)
#   git apply results/dev/session25/patches/mode_table.diff && git commit -qam "SAMU: the mode table (session 25)"
#   HEAD_COMMIT=$(git rev-parse HEAD)
#   git apply results/dev/session25/patches/summary_cap80.diff && git commit -qam "SAMU: the summary at 80 registers"
#   CAP_COMMIT=$(git rev-parse HEAD)
#   rm -rf tprev tcap && mkdir tprev tcap
#   git archive $PREV samu tests scripts | tar -x -C tprev; git archive $CAP_COMMIT samu tests scripts | tar -x -C tcap
#   git reset -q --hard $HEAD_COMMIT    # the cap's commit off main again (a clean tree: nothing else is lost)
# Run:  HEAD_COMMIT=<hex> PREV_COMMIT=<hex> CAP_COMMIT=<hex> bash results/dev/session25/scripts/modes_call.sh
# Keep the table (HEAD_COMMIT) if its bits are the same and fwd + bwd is faster at the three shapes: no new gate run is
# needed then. Else `git reset -q --hard $PREV`. Delete tprev and tcap before committing anything.
# ~7 minutes warm, estimated: the bits in eight processes a tree under 240 s (a fresh machine's compiles took up to
# 450 s in four, session 19), the profiles 3 x up to 50 s, the capped tree's up to 90 s.
set -u
cd "$(dirname "$0")/../../../.."
: "${HEAD_COMMIT:?}" "${PREV_COMMIT:?}" "${CAP_COMMIT:?}"
OUT=${OUT:-$PWD/out}; export OUT
mkdir -p $OUT/w
SHAPES="1,8192,1024;4,2048,2048;1,32768,2048"
SAMU_GIT_COMMIT=$HEAD_COMMIT PARTS=8 LIMIT=240 bash scripts/gpu_bits.sh samu tprev > $OUT/bits.txt 2>&1
echo "bits exit $?"
SAMU_GIT_COMMIT=$HEAD_COMMIT STAGES=profile OLD_COMMIT=$PREV_COMMIT SHAPES="$SHAPES" \
  bash scripts/gpu_change.sh samu tprev > $OUT/change.txt 2>&1
echo "change exit $? (1 expected: the profile stage alone runs no tests)"
mkdir -p $OUT/w/profile-cap
(cd tcap && SAMU_GIT_COMMIT=$CAP_COMMIT timeout 90 env PYTHONPATH=$PWD python3 scripts/gpu_profile.py --op samu \
  --backend triton_grouped --out $OUT/w/profile-cap --shapes "$SHAPES" > $OUT/w/profile-cap.log 2>&1)
echo "cap exit $?"
tar -czf $OUT/results.tar.gz -C $OUT/w .
tail -n 1 $OUT/w/same-samu.txt
grep -h "^profile-" $OUT/change.log
grep -h "fb graph" $OUT/w/profile-cap.log | sed 's/^/cap /'
