#!/usr/bin/env bash
# Prepared in session 13 for the next device session's first call (~5 minutes). From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session13/scripts/next1.sh
# 1. correctness: the decoding tests on the GPU (the decode plan has not run there: graphed decoders capture
#    decode(token, state, plan)), and the clipped-AdamW train test after the AdamW tests, with tracebacks;
# 2. issue 10: samu train (400m, 4 x 2048, compiled) for 100 steps with every thread's stack sampled every 2 ms
#    (hostsample.py) and nvidia-smi every 100 ms: what the host does in the slow phases.
set -u
cd "$(dirname "$0")/../../../.."
S=results/dev/session13/scripts
STAGES="tests sample"
. scripts/stage.sh
workspace next1.log
stage tests 200 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/models/test_generate.py \
  tests/test_helpers.py 2>&1 | grep -v "^\s*$" | tail -40
stage tests 120 $PY -m pytest -q -p no:cacheprovider --tb=short -m "gpu or not gpu" tests/ops/test_adamw.py \
  tests/test_train.py -k "adamw or clipped_step" 2>&1 | grep -v "^\s*$" | tail -40
save
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 100 > "$W/smi.csv" 2>&1 &
SMI=$!
stage sample 150 $PY $S/hostsample.py s1 100 2>&1 | grep -v "^\s*$" | tail -22
kill $SMI
save
