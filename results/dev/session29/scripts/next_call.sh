#!/usr/bin/env bash
# For the next device session (written in session 29, not yet run): plan item 0's a, b and c in one call (~8 minutes),
# from a clean archive of the tree (tclean, docs/performance.md "Plan for the next device session"):
#   cd tclean && COMMIT=<full hex> OUT=$OUT bash results/dev/session29/scripts/next_call.sh
# a. latency.py: an eager SAMU fwd + bwd timed as the harness does (one call between synchronisations) and back to back;
# b. skinny.py: split-K Triton products against cuBLAS at 8 and 64 rows (decoding's four product shapes);
# c. the packed scope on the current code (the report's packed table), resumable with `samu bench --resume`.
# Each stage under its own limit; everything lands in $OUT (results.tar.gz packs $OUT/w after every stage).
set -u
: "${COMMIT:?COMMIT must be the full commit hash of the tree}"
. scripts/stage.sh
workspace next_call.log
export SAMU_GIT_COMMIT=$COMMIT SAMU_AUTO_GATE=0
STAGES=${STAGES:-"latency skinny packed"}
stage latency 120 $PY results/dev/session29/scripts/latency.py
save
stage skinny 300 $PY results/dev/session29/scripts/skinny.py
save
stage packed 180 $PY -m samu.cli bench --quiet --scopes packed --shapes packed --impls auto --peers none \
  --out $W/bench-packed.json
save
tail -n 30 $OUT/next_call.log
