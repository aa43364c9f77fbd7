#!/usr/bin/env bash
# Session 16, call 1. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session16/scripts/call1.sh
# 1. GPU tests of session 15's review mends (plan item 0);
# 2. issue 10: fused against split bias gradient, 500 steps of samu train (400m, 4 x 2048) at seeds 0, 1, 2, and the
#    control (split with reversed bias sums) at seed 0; final validation losses compared.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session16/scripts
STAGES="${STAGES:-tests train}"
. scripts/stage.sh
workspace call1.log
stage tests 100 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_geglu.py \
  tests/ops/test_linear.py tests/test_train.py -k "unit or low or copies or compile_on" > "$W/tests.log" 2>&1
tail -4 "$W/tests.log"
save
STEPS=${STEPS:-500}
for run in "f0 fused 0" "s0 split 0" "r0 splitrev 0" "f1 fused 1" "s1 split 1" "f2 fused 2" "s2 split 2"; do
  set -- $run
  stage train 85 $PY $S/qualtab.py $1 $2 $3 $STEPS 2>&1 | grep -v "^\s*$" | tail -2
  save
done
$PY - "$W" <<'PYEOF'
import glob, json, sys
for p in sorted(glob.glob(f"{sys.argv[1]}/qual_*.json")):
    r = json.load(open(p))
    ivs = [e["recent_tokens_per_s"] for e in r["train"][2:]]
    print(f"{r['tag']:3s} {r['mode']:8s} seed {r['seed']}: val {r['val'][-1]['val_loss']:.5f}  train "
          f"{r['train'][-1]['loss']:.5f}  {sum(ivs) / len(ivs) / 1e3:.1f}K tok/s")
PYEOF
