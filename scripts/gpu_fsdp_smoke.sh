#!/usr/bin/env bash
# FSDP2 and sharded checkpoints on one CUDA GPU (issue 16), through the device tool in one call:
#
#   bash scripts/gpu_fsdp_smoke.sh
#
# The small preset at 8 x 2048 for 40 steps three ways, compiled (the CUDA default, fused AdamW, bf16
# autocast): one plain process; one process of torchrun sharding it (--data-parallel fsdp over a group of
# one: DTensor parameters, the fused AdamW on them, FSDP's hooks under torch.compile, a DCP checkpoint every
# 20 steps); and a copy of the sharded run's step-20 checkpoint resumed by one plain process. Their logs
# come back as $OUT/train-{plain,fsdp,resumed}.json with $OUT/fsdp.log; the digest compares their losses
# (bf16 autocast: close, not equal) and speeds. Set SAMU_GIT_COMMIT when .git does not travel; SMOKE_ARGS
# adds options to every run (a dry run on the CPU: --preset tiny --seq-len 32 --device cpu).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/fsdp.log") 2>&1

ARGS=(train --preset small --steps 40 --batch-size 8 --seq-len 2048 --eval-every 20 --eval-batches 2
      --checkpoint-every 20 --warmup 5 --no-progress ${SMOKE_ARGS:-})
run() {  # run NAME SECONDS COMMAND...: the command under a limit, its log to $OUT/train-NAME.json
  local name=$1 limit=$2 start=$SECONDS; shift 2
  echo "=== $name (limit ${limit}s): $*"
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  echo "=== $name: exit $? after $((SECONDS - start))s"
  [ -f "/tmp/fsdp-$name/log.json" ] && cp "/tmp/fsdp-$name/log.json" "$OUT/train-$name.json"
}
run plain 150 $PY -m samu.cli "${ARGS[@]}" --out /tmp/fsdp-plain
run fsdp 150 $PY -m torch.distributed.run --standalone --nproc-per-node 1 -m samu.cli "${ARGS[@]}" \
  --data-parallel fsdp --out /tmp/fsdp-fsdp
ls -la /tmp/fsdp-fsdp
if [ -d /tmp/fsdp-fsdp/checkpoint-20 ]; then
  mkdir -p /tmp/fsdp-resumed
  cp -r /tmp/fsdp-fsdp/checkpoint-20 /tmp/fsdp-fsdp/.samu-run /tmp/fsdp-resumed/
  ln -s checkpoint-20 /tmp/fsdp-resumed/checkpoint
  # the log as it stood at step 20 is inside the checkpoint; resume writes it on
  run resumed 150 $PY -m samu.cli train --out /tmp/fsdp-resumed --resume --data-parallel ddp --no-progress \
    ${SMOKE_ARGS:-}
fi
echo "=== digest"
$PY - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
for name in ("plain", "fsdp", "resumed"):
    path = Path(sys.argv[1]) / f"train-{name}.json"
    if not path.exists():
        print(f"{name}: no log")
        continue
    log = json.loads(path.read_text())
    losses = [round(e["loss"], 4) for e in log["train"]]
    vals = [round(v["val_loss"], 4) for v in log["val"]]
    rate = log["train"][-1]["recent_tokens_per_s"] if log["train"] else 0
    print(f"{name}: compiled={log.get('compiled')} world={log.get('world_size')} losses={losses} val={vals} "
          f"last interval {rate:,.0f} tok/s")
EOF
