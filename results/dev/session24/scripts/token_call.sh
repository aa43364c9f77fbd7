#!/usr/bin/env bash
# For the next session (written in session 24, not yet run: the device was paused): the whole-token kernel judged in
# one call. Batch-1 SAMU decoding of the 400m preset (scripts/gpu_gen.py --mixers samu), with and without
# --whole-token (samu.models.generate.WHOLE_TOKEN) alternating in one tree: ON OFF ON OFF; then the decoding GPU
# tests (the whole-token kernel against one program taking every task, graphed against eager with it on, bf16
# decoding against the forward), then its settings (token_sweep.py). Each stage packs what it wrote into
# results.tar.gz. ~8 minutes on a warm machine (estimated; a hang would be cut by each stage's timeout).
#   COMMIT=<hex> bash results/dev/session24/scripts/token_call.sh
set -u
cd "$(dirname "$0")/../../../.."
: "${COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
export PYTHONPATH=$PWD SAMU_GIT_COMMIT=$COMMIT
pack() { tar -czf $OUT/results.tar.gz -C $W .; }
for i in 1 2; do
  for t in on off; do
    flag=""; [ $t = on ] && flag=--whole-token
    extra=""; [ $i = 2 ] && extra=--no-kernels
    mkdir -p $W/gen-$t-$i
    timeout 90 python3 scripts/gpu_gen.py --batches 1 --mixers samu --out $W/gen-$t-$i $flag $extra \
      > $W/gen-$t-$i.log 2>&1; echo "gen-$t-$i exit $?"
    pack
  done
done
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --tb=short tests/models/test_generate.py \
  > $W/tests.log 2>&1; echo "tests exit $?"
pack
# the kernel's settings (programs a multiprocessor, modes a step task, warps, 16-row tiles), if time is left
timeout 240 python3 results/dev/session24/scripts/token_sweep.py --out $W > $W/sweep.log 2>&1; echo "sweep exit $?"
pack
tail -n 3 $W/tests.log
grep -h "B=" $W/gen-*.log
tail -n 12 $W/sweep.log
