#!/usr/bin/env bash
# One device call: RG-LRU's 8 unreached GPU tests, Nsight Compute on SAMU's main backward, the block bench, decode profile.
set -u
cd "$(dirname "$0")/.."
STAGES="rg ncu block gen"
. scripts/stage.sh
workspace call1.log
export SAMU_GIT_COMMIT=c64c582
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
stage rg 250 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/ops/test_linear.py tests/ops/test_rglru_triton.py -k "linear or 777 or 2100 or compile_fullgraph or cuda_graph_capture or gate_class or fp32_wide" --durations=10
save
stage ncu 110 env OUT="$W" bash scripts/gpu_ncu.sh samu triton_grouped 1,32768,2048 _main_kernel
save
stage block 110 $PY scripts/gpu_block.py --out "$W"
save
stage gen 90 $PY scripts/gpu_gen.py --out "$W" --batches 1,64 --mixers samu
save
ls -la $W
