#!/usr/bin/env bash
# For the next device session (written in session 27, not yet run): the one-row products' L2 prefetch
# (samu.ops.rowprod_triton.PREFETCH, off as committed) judged in one call. Batch-1 decoding of the 400m preset,
# both mixers (scripts/gpu_gen.py), without and with --row-prefetch alternating in one tree: OFF ON OFF ON; then the
# products' tests compiled on the GPU (tests/ops/test_rowprod.py: the prefetch changes no bits) and the decoding GPU
# tests with the prefetch switched on in the pytest process. Each stage packs what it wrote into results.tar.gz.
# ~5 minutes warm (estimated).
#   COMMIT=<hex> bash results/dev/session27/scripts/prefetch_call.sh
# Keep it (PREFETCH = True in samu/ops/rowprod_triton.py, then `samu bench --scopes gen` for the record) if ON is
# faster than OFF in both rounds for both mixers and the tests pass.
set -u
cd "$(dirname "$0")/../../../.."
: "${COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
export PYTHONPATH=$PWD SAMU_GIT_COMMIT=$COMMIT
pack() { tar -czf $OUT/results.tar.gz -C $W .; }
for i in 1 2; do
  for t in off on; do
    flag=""; [ $t = on ] && flag=--row-prefetch
    extra=""; [ $i = 2 ] && extra=--no-kernels
    mkdir -p $W/gen-$t-$i
    timeout 120 python3 scripts/gpu_gen.py --batches 1 --mixers samu,rglru --out $W/gen-$t-$i $flag $extra \
      > $W/gen-$t-$i.log 2>&1; echo "gen-$t-$i exit $?"
    pack
  done
done
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short tests/ops/test_rowprod.py \
  > $W/rowprod.log 2>&1; echo "rowprod tests exit $?"
pack
timeout 240 python3 -c "import sys, pytest, samu.ops.rowprod_triton as r; r.PREFETCH = True; sys.exit(pytest.main(
  ['-m', 'gpu', '-q', '-p', 'no:cacheprovider', '-rfEs', '--tb=short', 'tests/models/test_generate.py']))" \
  > $W/tests.log 2>&1; echo "decoding tests (prefetch on) exit $?"
pack
tail -n 3 $W/rowprod.log $W/tests.log
for f in $W/gen-*.log; do echo "== $(basename $f)"; grep "B=" $f; done
