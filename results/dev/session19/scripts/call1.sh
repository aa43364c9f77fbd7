#!/usr/bin/env bash
# Session 19, call 1: what session 18 left owed (docs/performance.md, plan item 0a and half of 0b).
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session19/scripts/call1.sh
# t3f/ = 3f2631a's tree, untracked (git archive 3f2631a samu tests scripts | tar -x -C t3f).
# Side by side:
# 1. bits: scripts/bitsame.py --op samu for t3f and HEAD (SAMU's one-word change f0320dd), then compared;
# 2. tests: tests/ops/test_packing.py and SAMU's packed kernel tests on the GPU;
# 3. RG-LRU's unpacked gate classes with the |no_state call (never gated so): bf16, fp16, fp32, each dtype in
#    two processes (the primary and length shapes; the rest of the gate set). A process cut short keeps its
#    finished units (the record is written after every unit).
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="bits tests gates"
workspace call1.log
pids=()
for t in t3f head; do
  root=$PWD; [ $t != head ] && root=$PWD/t3f
  stage bits ${BITS_LIMIT:-420} env PYTHONPATH=$root $PY scripts/bitsame.py save --op samu $root $W/samu_$t.pt \
    > $W/bits_samu_$t.log 2>&1 &
  pids+=($!)
done
stage tests 420 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_packing.py \
  tests/ops/test_samu_triton.py -k "packed or pack" > $W/tests.log 2>&1 &
pids+=($!)
GATE=($PY -m samu.cli gate --quiet --no-status --ops rglru --backends variants)
for dtype in bfloat16 float16 float32; do
  stage gates ${LIMIT:-540} "${GATE[@]}" --dtypes $dtype --shapes primary,length \
    --out $W/gates-p-rglru-$dtype-a.json > $W/gates-$dtype-a.log 2>&1 &
  pids+=($!)
  stage gates ${LIMIT:-540} "${GATE[@]}" --dtypes $dtype --shapes gate,-primary,-length \
    --out $W/gates-p-rglru-$dtype-b.json > $W/gates-$dtype-b.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait $p; done
$PY scripts/bitsame.py compare $W/samu_t3f.pt $W/samu_head.pt > $W/same_samu.txt 2>&1
rm -f $W/*.pt
save
echo "== samu bits t3f vs head: $(tail -1 $W/same_samu.txt)"
echo "== tests: $(tail -1 $W/tests.log)"
for f in $W/gates-*.log; do
  echo "== $(basename $f): $(grep -c '^PASS' $f) PASS, $(grep -c '^FAIL' $f) FAIL; $(grep '=== gates: exit' $f | tail -1)"
done
