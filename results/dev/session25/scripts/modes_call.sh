#!/usr/bin/env bash
# For the next device session (written in session 25, not yet run: no device was lent): SAMU's mode table
# (patches/mode_table.diff) judged in one call. The patch moves the walks' float64 per-mode constants (exp nu,
# cos and sin of theta as fp32 hi/lo pairs) out of five kernels' prologues into one evaluation a call (the
# forward's controller kernel, the backward's adjoint summaries), so the summary, replay, main backward and dx
# kernels load a [5, N] table instead. Same bits in Triton's interpreter (16 cases, scripts/interp_bits.py); this
# call checks them on the H200 (scripts/gpu_bits.sh against the tree without the patch), times both trees
# alternating (gpu_change.sh's profile stage: this, the tree before, this), then a third tree with the grouped
# summary held to 80 registers (patches/summary_cap80.diff: 95 uncapped, offline), once.
#   COMMIT=<full hex of the commit the patches apply to> bash results/dev/session25/scripts/modes_call.sh
# ~8 minutes warm (estimated: bits up to 450 s on a fresh machine in session 19, here LIMIT=300; profiles 4 x ~40 s).
set -u
cd "$(dirname "$0")/../../../.."
: "${COMMIT:?}"
export SAMU_GIT_COMMIT=$COMMIT
OUT=${OUT:-$PWD/out}; export OUT
P=results/dev/session25/patches
rm -rf tprev tcap && mkdir tprev && cp -r samu tests scripts tprev/
patch -p1 --forward < $P/mode_table.diff || exit 1
mkdir tcap && cp -r samu tests scripts tcap/ && (cd tcap && patch -p1 --forward < ../$P/summary_cap80.diff) || exit 1
SHAPES="1,8192,1024;4,2048,2048;1,32768,2048"
LIMIT=300 bash scripts/gpu_bits.sh samu tprev; echo "bits exit $?"
STAGES=profile OLD_COMMIT=$COMMIT SHAPES="$SHAPES" bash scripts/gpu_change.sh samu tprev; echo "change exit $?"
mkdir -p $OUT/w/profile-cap
(cd tcap && timeout 90 env PYTHONPATH=$PWD python3 scripts/gpu_profile.py --op samu --backend triton_grouped \
  --out $OUT/w/profile-cap --shapes "$SHAPES" > $OUT/w/profile-cap.log 2>&1); echo "cap exit $?"
tar -czf $OUT/results.tar.gz -C $OUT/w .
grep -h "fb graph" $OUT/change.log $OUT/w/profile-cap.log | tail -n 12
