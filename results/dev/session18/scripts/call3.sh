#!/usr/bin/env bash
# Session 18, call 3 (issue 15): packed gates with the call training makes (no initial state, no final state:
# the gates' new |no_state results), both mixers, bf16 and fp32, four processes side by side; beside them every
# packed test of the Triton variants on the GPU. Patch A (gate a in the scans' layout) is in this commit.
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session18/scripts/call3.sh
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="gates tests"
workspace call3.log
GATE=($PY -m samu.cli gate --quiet --no-status --backends variants --shapes packed --documents 16)
pids=()
for op in rglru samu; do
  for dtype in bfloat16 float32; do
    stage gates ${LIMIT:-450} "${GATE[@]}" --ops $op --dtypes $dtype --out "$W/gates-$op-$dtype-packed.json" \
      > "$W/gates-$op-$dtype.log" 2>&1 &
    pids+=($!)
  done
done
stage tests 300 $PY -m pytest -q -p no:cacheprovider --tb=short tests/ops/test_samu_triton.py tests/ops/test_rglru_triton.py \
  tests/ops/test_packing.py -k "packed or pack" > "$W/tests.log" 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait $p; done
tail -3 "$W/tests.log"
for f in "$W"/gates-*.log; do echo "$f: $(grep -c '^PASS' $f) PASS, $(grep -c '^FAIL' $f) FAIL; $(tail -1 $f)"; done
save
