#!/usr/bin/env bash
# Issue 10's measurements on one H200 through the device tool, in stages that each fit one call:
#
#   bash scripts/gpu_model.sh STAGE ...    stages: glue block model2k train resume determinism model32k profile
#                                          detprofile
#
#   glue      the fused glue's and the block's tests on the GPU (pytest, the CUDA path of the CPU tests)
#   block     scripts/gpu_block.py (CUDA graph and eager, fused and PyTorch-op glue, GEMMs alone) and
#             `samu bench --scopes block --impls auto,compiled` at (4, 2048, 2048) and (1, 32768, 2048)
#   model2k   `samu bench --scopes model --impls auto,compiled` at 4 x 2048 (preset 400m): samu's LMs
#             and the model peers (SDPA transformer, fla HGRN and GLA when installed), eager and compiled
#   train     `samu train --preset 400m` at 4 x 2048: SAMU eager (30 steps), SAMU and RG-LRU compiled (60)
#   resume    the resume tests on the GPU (compiled there, some through `samu train` in a fresh process: a
#             resumed run must equal an uninterrupted one to the bit), failures with their tracebacks
#   determinism  the SAMU LM compiled as in train, 40 steps, with PyTorch's deterministic algorithms (the
#             default, D) and with --no-deterministic (N) in the order D N N D: what exact resumption costs
#   model32k  the model bench at 1 x 32768
#   profile   scripts/gpu_model_profile.py: where a training step's time goes (kernels by kind): the SAMU LM
#             compiled and the SDPA transformer compiled at 4 x 2048, the SAMU LM compiled at 1 x 32768 and
#             eager at 4 x 2048
#   detprofile  the SAMU LM compiled at 4 x 2048 profiled as in profile, host included, without (N) and with (D)
#             the deterministic settings `samu train` runs with by default (gpu_model_profile.py --deterministic
#             --host), in the order N D D N
#
# Writes $OUT/model.log and $OUT/results.tar.gz (every record of the stages run) and prints a digest.
# Peers: wheels in .whl/ (carry it) are installed to /tmp/peers. Stages' limits (s): glue 150, block 420, model2k
# 560, train 460, resume 280, determinism 440, model32k 560, profile 420, detprofile 400; put stages in one call
# only where theirs, with 15 s a command to stop, add up to under 570. Set SAMU_GIT_COMMIT when .git does not
# travel.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
W="$OUT/w"
mkdir -p "$W"
STAGES="${*:-glue}"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/peers .whl/*.whl 2>&1 | tail -2
  export PYTHONPATH="/tmp/peers:$PWD"
else
  export PYTHONPATH="$PWD"
fi
exec > >(tee -a "$OUT/model.log") 2>&1

. scripts/stage.sh

train_run() {  # train_run NAME STEPS ARGS...: the 400m preset at 4 x 2048; only the log comes back
  local name=$1 steps=$2; shift 2
  $PY -m samu.cli train --preset 400m --steps "$steps" --batch-size 4 --seq-len 2048 --eval-every 1000 \
    --eval-batches 1 --checkpoint-every 1000 --warmup 10 --no-progress --out "/tmp/runs/$name" "$@"
  cp "/tmp/runs/$name/log.json" "$W/train-$name.json"
}

stage glue 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_glue.py tests/modules/test_block.py \
  tests/modules/test_compile.py tests/models/test_compile_gpu.py
stage block 120 $PY scripts/gpu_block.py --out "$W"
stage block 300 $PY -m samu.cli bench --scopes block --impls auto,compiled --shapes 4x2048x2048,1x32768x2048 \
  --out "$W/bench-block.json" --quiet
stage model2k 560 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 4x2048x1664 \
  --out "$W/bench-model-2k.json" --quiet
case " $STAGES " in *" train "*)
  echo "=== train"
  start=$SECONDS
  timeout 100 bash -c "$(declare -f train_run); PY=$PY W=$W; train_run samu-eager 30 --no-compile"
  timeout 180 bash -c "$(declare -f train_run); PY=$PY W=$W; train_run samu-compiled 60"
  timeout 180 bash -c "$(declare -f train_run); PY=$PY W=$W; train_run rglru-compiled 60 --mixer rglru"
  echo "=== train: after $((SECONDS - start))s" ;;
esac
stage resume 280 $PY -m pytest -q -rf --tb=short -p no:cacheprovider -m "gpu or not gpu" tests/test_train.py \
  tests/test_runs.py tests/models/test_transformer.py -k "resume"
case " $STAGES " in *" determinism "*)
  echo "=== determinism"
  start=$SECONDS
  for run in "deterministic-1" "nondeterministic-1 --no-deterministic" "nondeterministic-2 --no-deterministic" \
             "deterministic-2"; do
    set -- $run
    timeout 110 bash -c "$(declare -f train_run); PY=$PY W=$W; train_run samu-compiled-$1 40 ${2:-}"
  done
  echo "=== determinism: after $((SECONDS - start))s" ;;
esac
stage model32k 560 $PY -m samu.cli bench --scopes model --impls auto,compiled --shapes 1x32768x1664 \
  --out "$W/bench-model-32k.json" --quiet

for run in "samu compiled 4x2048x1664" "sdpa-transformer compiled 4x2048x1664" "samu compiled 1x32768x1664" \
           "samu auto 4x2048x1664"; do
  set -- $run
  stage profile 105 $PY scripts/gpu_model_profile.py --model "$1" --impl "$2" --shape "$3" --out "$W"
done
i=0
for flag in "" --deterministic --deterministic ""; do  # N D D N: the order's own drift shows
  i=$((i + 1))
  mkdir -p "$W/detprofile-$i"
  stage detprofile 100 $PY scripts/gpu_model_profile.py --model samu --impl compiled --shape 4x2048x1664 --host \
    --out "$W/detprofile-$i" $flag
done

tar -czf "$OUT/results.tar.gz" -C "$W" .
echo "=== digest"
for f in "$W"/train-*.json; do
  [ -f "$f" ] || continue
  $PY - "$f" <<'EOF'
import json, sys
log = json.load(open(sys.argv[1]))
last = log["train"][-1] if log["train"] else {}
print(sys.argv[1].rsplit("/", 1)[-1], "compiled" if log.get("compiled") else "eager",
      f"{last.get('recent_tokens_per_s', 0):.0f} tok/s (last interval)", f"MFU {last.get('mfu')}")
EOF
done
