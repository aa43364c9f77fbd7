#!/usr/bin/env bash
# For the next device session (written in session 27, not yet run): two decoding changes, both off as committed,
# judged in one call on the 400m preset in bf16 (scripts/gpu_gen.py), each against the committed setting in one tree,
# counterbalanced (OFF ON, then ON OFF; the first round with the kernel tables):
#   1. the one-row products' L2 prefetch (samu.ops.rowprod_triton.PREFETCH, --row-prefetch) at batch 1;
#   2. the row products on tensor cores above one row (rowprod_triton.MAX_ROWS, --max-rows 64) at batches 8 and 64,
#      against the forward's cuBLAS products.
# Then the products' tests compiled on the GPU (tests/ops/test_rowprod.py: 1 to 64 rows against float64; the prefetch
# changes no bits), their bf16 cases again under compute-sanitizer's memcheck (no out-of-bounds load), and the
# decoding GPU tests with both switched on in the pytest process (bf16 decoding at 1 and 4 rows against the forward).
# Each stage packs what it wrote into results.tar.gz (scripts/stage.sh's workspace and save; the call's output is
# also in decode.log). ~8 minutes warm (estimated: session 27's four gen runs and tests took 210 s; memcheck's
# slowdown is a guess: its stage has its own timeout).
#   COMMIT=<hex> bash results/dev/session27/scripts/decode_call.sh
# Keep a change (PREFETCH = True, or MAX_ROWS = 64, in samu/ops/rowprod_triton.py; then `samu bench --scopes gen` for
# the record) if ON is faster than OFF in both rounds for both mixers and the tests pass.
set -u
cd "$(dirname "$0")/../../../.."
: "${COMMIT:?}"
. scripts/stage.sh
workspace decode.log
export SAMU_GIT_COMMIT=$COMMIT
gen() {   # name, batches, flags...
  local name=$1 batches=$2; shift 2
  mkdir -p $W/$name
  timeout 150 $PY scripts/gpu_gen.py --batches $batches --mixers samu,rglru --out $W/$name "$@" \
    > $W/$name.log 2>&1; echo "$name exit $?"
  save
}
gen prefetch-off-1 1
gen prefetch-on-1 1 --row-prefetch
gen rows-off-1 8,64
gen rows-on-1 8,64 --max-rows 64
gen rows-on-2 8,64 --max-rows 64 --no-kernels
gen rows-off-2 8,64 --no-kernels
gen prefetch-on-2 1 --row-prefetch --no-kernels
gen prefetch-off-2 1 --no-kernels
timeout 150 $PY -m pytest -q -p no:cacheprovider -rfEs --tb=short tests/ops/test_rowprod.py \
  > $W/rowprod.log 2>&1; echo "rowprod tests exit $?"
save
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m pytest -q -p no:cacheprovider -x \
  tests/ops/test_rowprod.py -k "matches_float64 and dtype0" > $W/memcheck.log 2>&1; echo "memcheck exit $?"
save
timeout 200 $PY -c "import sys, pytest, samu.ops.rowprod_triton as r; r.PREFETCH = True; r.MAX_ROWS = 64; sys.exit(
  pytest.main(['-m', 'gpu', '-q', '-p', 'no:cacheprovider', '-rfEs', '--tb=short', 'tests/models/test_generate.py']))" \
  > $W/tests.log 2>&1; echo "decoding tests (both on) exit $?"
save
tail -n 3 $W/rowprod.log $W/memcheck.log $W/tests.log
for f in $W/*-[12].log; do echo "== $(basename $f)"; grep "B=" $f | grep -v "^---"; done
