#!/usr/bin/env bash
# Session 15, call 3 (issue 10: gate_up's bias gradient out of the GeGLU backward kernel). From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session15/scripts/call3.sh
# 1. GPU tests: the GeGLU kernels (the summing backward, the product and gate as one unit under Inductor), the
#    linear, the compile-flag train test (mended after call 2) and the clip tests call 1 did not reach;
# 2. samu train (400m, 4 x 2048, compiled, bf16 weight copies on, 100 steps): a 30-step throwaway run, then fused /
#    split in the order f s s f, nvidia-smi beside; each mode's runs' loss logs compared.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session15/scripts
STAGES="${STAGES:-tests train}"
. scripts/stage.sh
workspace call3.log
stage tests 100 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_geglu.py \
  tests/ops/test_linear.py tests/test_train.py -k "geglu or linear or compile_on or clip_grad_norm" > "$W/tests.log" 2>&1
tail -6 "$W/tests.log"
save
stage train 120 $PY $S/sumtab.py w1 fused 30 2>&1 | grep -v "^\s*$" | tail -2
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
TAGS="f1 s1 s2 f2"
for tag in $TAGS; do
  mode=fused; [ "${tag:0:1}" = s ] && mode=split
  stage train 75 $PY $S/sumtab.py $tag $mode 100 2>&1 | grep -v "^\s*$" | tail -2
  save
done
kill $SMI
$PY - "$W" $TAGS <<'PYEOF'
import json, sys
runs = {}
for t in sys.argv[2:]:
    try:
        runs[t] = json.load(open(f"{sys.argv[1]}/optab_{t}.json"))
    except (OSError, ValueError) as e:
        print(t, "no record:", e)
for t, r in runs.items():
    s = sorted(r["gpu_ms"][20:])
    ivs = [e["recent_tokens_per_s"] for e in r["log"][1:]]
    print(f"{t}: step median {s[len(s) // 2]:.2f} ms, mean {sum(s) / len(s):.2f}; intervals mean "
          f"{sum(ivs) / len(ivs) / 1e3:.1f}K tokens/s; last loss {r['log'][-1]['loss']:.6f}")
for mode in "fs":
    losses = [[(e["loss"], e["grad_norm"]) for e in r["log"]] for t, r in runs.items() if t[0] == mode]
    print(f"{mode}: losses equal in its {len(losses)} runs:", len({str(v) for v in losses}) == 1)
PYEOF
save
