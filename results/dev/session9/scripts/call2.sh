#!/usr/bin/env bash
# One device call (session 9, call 2): SAMU's main backward with its slot's delta kept in L2 (evict_last hints
# on the slot's stores and loads; this tree, uncommitted, results/dev/session9/samu_evict_last.patch) timed
# beside OLD = ab/old (60f2c3c, SAMU v3.6) as NEW OLD NEW; Nsight Compute on NEW's main backward (DRAM bytes);
# then from ab/old (the committed kernels): `samu train --preset 400m` at 4 x 2048 compiled, and the block.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
STAGES="prof ncu train block"
. scripts/stage.sh
workspace call2.log
export W
prof() {  # prof TAG DIR COMMIT
  mkdir -p "$W/$1"; echo "=== $1"
  (cd "$2" && PYTHONPATH="$2" SAMU_GIT_COMMIT="$3" timeout --signal=INT --kill-after=10 70 $PY scripts/gpu_profile.py \
     --shapes "1,32768,2048;4,2048,2048;1,8192,1024" --out "$W/$1" 2>&1 | grep -E "fb graph|_main_kernel|_dx_kernel")
  save
}
prof p1-new "$ROOT" 60f2c3c-evict_last
prof p2-old "$ROOT/ab/old" 60f2c3c
prof p3-new "$ROOT" 60f2c3c-evict_last
SAMU_GIT_COMMIT=60f2c3c-evict_last stage ncu 70 env OUT="$W" bash scripts/gpu_ncu.sh samu triton_grouped 1,32768,2048 _main_kernel
save
cd "$ROOT/ab/old"
export PYTHONPATH="$PWD" SAMU_GIT_COMMIT=60f2c3c
stage train 240 $PY -m samu.cli train --preset 400m --steps 60 --batch-size 4 --seq-len 2048 --eval-every 1000 \
  --eval-batches 1 --checkpoint-every 1000 --warmup 10 --no-progress --out /tmp/runs/t400
cp /tmp/runs/t400/log.json "$W/train_400m_compiled.json" 2>/dev/null
save
stage block 120 $PY scripts/gpu_block.py --out "$W"
save
$PY -c "
import json; d=json.load(open('$W/train_400m_compiled.json'))
for e in d['train']: print(e['step'], round(e['recent_tokens_per_s']), round(e.get('mfu') or 0, 3))
" 2>&1 | tail -8
