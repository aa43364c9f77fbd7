#!/usr/bin/env bash
# One device call: SAMU's main backward at BM = 32 against 64 (ab/bm.py, exploratory, ungated), and `samu train`
# with the 400m preset at 4 x 2048, compiled, 60 steps, at this checkout.
set -u
cd "$(dirname "$0")/.."
STAGES="bm train"
. scripts/stage.sh
workspace call3.log
export SAMU_GIT_COMMIT=$(cat ab/NEWC)
export W
stage bm 200 $PY ab/bm.py
save
stage train 260 $PY -m samu.cli train --preset 400m --steps 60 --batch-size 4 --seq-len 2048 --eval-every 1000 \
  --eval-batches 1 --checkpoint-every 1000 --warmup 10 --no-progress --out /tmp/runs/t400
cp /tmp/runs/t400/log.json "$W/train_400m_compiled.json" 2>/dev/null
save
$PY -c "
import json; d=json.load(open('$W/train_400m_compiled.json'))
for e in d['train']: print(e['step'], round(e['recent_tokens_per_s']), round(e.get('mfu') or 0, 3))
" 2>&1 | tail -8
