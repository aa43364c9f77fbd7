#!/usr/bin/env bash
# Issue 16's measurements on 2 GPUs of one host (device kind nvidia-h200-x2), in stages that fit one call:
#
#   bash scripts/gpu_multi.sh STAGE ...    stages: tests ddp fsdp sp longest gates
#
#   tests    pytest -m gpu of the multi-process training tests (DDP on 2 GPUs equals one with accumulation)
#   ddp      samu train --preset 400m at 4 x 2048 a GPU, compiled, 40 steps: 1 process, then 2 (DDP);
#            scaling efficiency = tokens/s on 2 / (2 x tokens/s on 1), target >= 95%
#   fsdp     the same on 2 processes with --data-parallel fsdp
#   sp       scripts/gpu_sp.py: each mixer's fwd + bwd at (1, 262144, 2048) bf16 on 1 GPU, then split over 2
#            (target: >= 1.8x one GPU)
#   longest  scripts/gpu_sp.py --longest: the longest sequence one block of width 2048 trains on, 1 vs 2 GPUs
#   gates    samu gate at (1, 262144, 1024) and (1, 262144, 2048), bf16, both mixers' Triton variants
#
# Writes $OUT/multi.log and $OUT/results.tar.gz (every record of the stages run) and prints a digest.
# Set SAMU_GIT_COMMIT when .git does not travel. NCCL_NVLS_ENABLE=0: leave NVLink multicast off.
set -u
cd "$(dirname "$0")/.."
. scripts/stage.sh
STAGES="${*:-tests ddp sp}"
workspace multi.log
export NCCL_NVLS_ENABLE=0

RUN="$PY -m torch.distributed.run --standalone"
TRAIN=(-m samu.cli train --preset 400m --steps 40 --batch-size 4 --seq-len 2048 --eval-every 1000 --eval-batches 1
       --checkpoint-every 1000 --warmup 10 --no-progress)
train_run() {  # train_run NAME PROCESSES ARGS...: only the log comes back
  local name=$1 n=$2; shift 2
  $RUN --nproc-per-node "$n" "${TRAIN[@]}" --out "/tmp/runs/$name" "$@" && cp "/tmp/runs/$name/log.json" "$W/train-$name.json"
}

stage tests 240 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_train.py -k "ddp or fsdp"
stage ddp 200 bash -c "$(declare -f train_run); RUN='$RUN'; W='$W'; TRAIN=(${TRAIN[*]}); train_run one 1"
stage ddp 200 bash -c "$(declare -f train_run); RUN='$RUN'; W='$W'; TRAIN=(${TRAIN[*]}); train_run ddp 2"
stage fsdp 200 bash -c "$(declare -f train_run); RUN='$RUN'; W='$W'; TRAIN=(${TRAIN[*]}); train_run fsdp 2 --data-parallel fsdp"
stage sp 240 $RUN --nproc-per-node 1 scripts/gpu_sp.py --out "$W/sp1"
stage sp 240 $RUN --nproc-per-node 2 scripts/gpu_sp.py --out "$W/sp2"
stage longest 240 $RUN --nproc-per-node 1 scripts/gpu_sp.py --ops samu --length 8192 --reps 1 --longest --out "$W/long1"
stage longest 240 $RUN --nproc-per-node 2 scripts/gpu_sp.py --ops samu --length 8192 --reps 1 --longest --out "$W/long2"
stage gates 420 $PY -m samu.cli gate --quiet --ops samu,rglru --shapes 1x262144x1024,1x262144x2048 --dtypes bf16 \
  --backends variants --out "$W/gates-262k.json"

save
echo "=== digest"
$PY - "$W" <<'EOF'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
rates = {}
for name in ("one", "ddp", "fsdp"):
    p = w / f"train-{name}.json"
    if p.exists():
        log = json.loads(p.read_text())
        rates[name] = log["train"][-1]["recent_tokens_per_s"]
        print(f"train {name}: {log['world_size']} process(es), {rates[name]:,.0f} tokens/s (last interval)")
for name in ("ddp", "fsdp"):
    if name in rates and "one" in rates:
        print(f"{name} scaling efficiency on 2 GPUs: {rates[name] / (2 * rates['one']):.1%} (target 95%)")
sp = {}
for n in (1, 2):
    p = w / f"sp{n}" / f"sp_{n}.json"
    if p.exists():
        for row in json.loads(p.read_text())["rows"]:
            sp[(row["op"], n)] = row["fb_ms"]
for op in ("samu", "rglru"):
    if (op, 1) in sp and (op, 2) in sp:
        print(f"{op} L=262144: {sp[(op, 1)]:.2f} ms on 1 GPU, {sp[(op, 2)]:.2f} ms on 2: {sp[(op, 1)] / sp[(op, 2)]:.2f}x "
              f"(target 1.8x)")
for n in (1, 2):
    p = w / f"long{n}" / f"sp_{n}.json"
    if p.exists():
        print(f"longest block on {n} GPU(s): L = {json.loads(p.read_text())['rows'][-1]['block_L']:,}")
EOF
