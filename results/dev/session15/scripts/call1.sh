#!/usr/bin/env bash
# Session 15, call 1 (issue 10: the bf16 weight copies written by the optimizer's step). From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session15/scripts/call1.sh
# 1. samu train (400m, 4 x 2048, compiled, 100 steps) low / cast / cast / low, nvidia-smi beside; the runs' loss
#    logs compared (the same seeds: equal losses say the copies change nothing on the GPU's compiled path);
# 2. GPU tests of the change (what time is left): the AdamW kernels' low copies (hardware rounding against torch's
#    cast), the linear with a low weight (Inductor), the clipped-AdamW train test and the GPU train tests.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session15/scripts
STAGES="${STAGES:-tests train}"
. scripts/stage.sh
workspace call1.log
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
for run in "l1 low" "c1 cast" "c2 cast" "l2 low"; do
  set -- $run
  stage train 110 $PY $S/lowtab.py $1 $2 100 2>&1 | grep -v "^\s*$" | tail -6
  save
done
kill $SMI
$PY - "$W" <<'PYEOF'
import json, sys
runs = {}
for t in ("l1", "c1", "c2", "l2"):
    try:
        runs[t] = json.load(open(f"{sys.argv[1]}/optab_{t}.json"))
    except (OSError, ValueError) as e:
        print(t, "no record:", e)
for t, r in runs.items():
    s = sorted(r["gpu_ms"][20:])
    ivs = [e["recent_tokens_per_s"] for e in r["log"][1:]]
    print(f"{t}: step median {s[len(s) // 2]:.2f} ms, mean {sum(s) / len(s):.2f}; intervals mean "
          f"{sum(ivs) / len(ivs) / 1e3:.1f}K tokens/s")
losses = {t: [(e["loss"], e["grad_norm"]) for e in r["log"]] for t, r in runs.items()}
print("copies:", {t: r.get("bf16_weight_copies") for t, r in runs.items()})
print(f"losses equal in all {len(losses)} runs:", len({str(v) for v in losses.values()}) == 1)
PYEOF
save
stage tests 170 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_adamw.py \
  tests/ops/test_linear.py tests/test_train.py -k "adamw or linear or clipped or bf16_autocast or compile_on" \
  > "$W/tests.log" 2>&1
tail -15 "$W/tests.log"
save
