#!/usr/bin/env bash
# Session 15, call 2 (issue 10). From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session15/scripts/call2.sh
# call1's first two runs on a fresh machine were noisy (steps of 44-72 ms throughout, both modes), its last two
# clean: so a throwaway run first (it also fills Inductor's caches), then low / cast in the order l c c l l c, 100
# steps each, nvidia-smi beside; the runs' loss logs compared; then the GPU tests call1 failed or cut.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session15/scripts
STAGES="${STAGES:-tests train}"
. scripts/stage.sh
workspace call2.log
stage train 120 $PY $S/lowtab.py w0 low 30 2>&1 | grep -v "^\s*$" | tail -3
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
TAGS="l3 c3 c4 l4 l5 c5"
for tag in $TAGS; do
  mode=low; [ "${tag:0:1}" = c ] && mode=cast
  stage train 75 $PY $S/lowtab.py $tag $mode 100 2>&1 | grep -v "^\s*$" | tail -3
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
    print(f"{t} copies {r.get('bf16_weight_copies')}: step median {s[len(s) // 2]:.2f} ms, mean {sum(s) / len(s):.2f};"
          f" intervals mean {sum(ivs) / len(ivs) / 1e3:.1f}K tokens/s")
losses = {t: [(e["loss"], e["grad_norm"]) for e in r["log"]] for t, r in runs.items()}
print(f"losses equal in all {len(losses)} runs:", len({str(v) for v in losses.values()}) == 1)
PYEOF
save
stage tests 110 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_adamw.py \
  tests/test_train.py -k "low or bf16_autocast or compile_on" > "$W/tests.log" 2>&1
tail -8 "$W/tests.log"
save
