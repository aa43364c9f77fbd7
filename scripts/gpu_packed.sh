#!/usr/bin/env bash
# Issue 15 on one H200 through the device tool, in stages:
#
#   bash scripts/gpu_packed.sh [STAGE ...]    stages: tests gates bench (the default: ~8.5 minutes at most),
#                                             profile (~1 minute),
#                                             train (a call of its own: ~4 minutes at most)
#
#   tests   every packing test on the GPU: the gpu-marked packed gates of each variant at (1, 5000, 1024),
#           the CPU tests' CUDA path (packed mixers, glue, block, model, generation, packed kernels) and the
#           packed model traced whole (aot_eager)
#   gates   `samu gate --documents 16` at the packed shapes (bf16, fp32): the packed classes the bench's
#           `auto` dispatches by; its status, rebuilt from results/ and this record, serves the later stages
#   bench   `samu bench --scopes packed --shapes packed`: each mixer unpacked and packed into 16 and 256
#           sequences side by side (issue 15's target: packed within 5% of unpacked)
#   profile scripts/gpu_packed_profile.py: each mixer's kernels unpacked and packed (16, 256), per kernel
#   train   `samu train --pack` beside plain `samu train`, both through torch.compile (Inductor), the small
#           preset at 8 x 2048, 30 steps each (run after gates, whose status it needs: SAMU_GATE_STATUS)
#
# Writes $OUT/packed.log and, after every stage (a call cut short keeps what finished), $OUT/results.tar.gz
# with the records and logs. Set SAMU_GIT_COMMIT when .git does not travel.
set -u
cd "$(dirname "$0")/.."
. scripts/stage.sh
STAGES="${*:-tests gates bench}"
workspace packed.log

stage tests 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_packing.py \
  tests/ops/test_glue.py tests/models/test_generate.py -k "packed or pack or different_lengths"
stage tests 90 $PY -m pytest -q -p no:cacheprovider tests/ops/test_samu_triton.py tests/ops/test_rglru_triton.py \
  tests/modules/test_compile.py -k packed
save
stage gates 150 $PY -m samu.cli gate --ops samu,rglru --shapes packed --dtypes bfloat16,float32 --backends variants \
  --documents 16 --out "$W/gates-packed.json" --results results --status "$W/status.json" --quiet
save
if [ -f "$W/status.json" ]; then export SAMU_GATE_STATUS="$W/status.json" SAMU_AUTO_GATE=0; fi
stage bench 120 $PY -m samu.cli bench --scopes packed --shapes packed --impls auto --peers none \
  --out "$W/bench-packed.json" --quiet
save
stage profile 120 $PY scripts/gpu_packed_profile.py --out "$W"
save
case " $STAGES " in *" train "*)
  echo "=== train"
  for how in plain pack; do
    flag=$([ "$how" = pack ] && echo --pack)
    timeout --signal=INT 110 $PY -m samu.cli train --preset small --steps 30 --batch-size 8 --seq-len 2048 \
      --eval-every 1000 --eval-batches 1 --checkpoint-every 1000 --warmup 5 --no-progress --out "/tmp/runs/$how" \
      $flag && cp "/tmp/runs/$how/log.json" "$W/train-$how.json"
  done
  save ;;
esac
