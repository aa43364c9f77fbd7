#!/usr/bin/env bash
# Session 15, call 3. From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session15/scripts/call3.sh
# 1. the compile-flag train test call2 failed (it now trains on the CPU, where "auto" does not compile);
# 2. issue 10: where the samu train step goes now (session 8's trainprof.py: 400m, 4 x 2048, compiled, the bf16
#    weight copies on, steps 31-35 under torch.profiler; the last such profile is session 8's);
# 3. issue 13: Nsight Compute on RG-LRU's weight-gradient kernel at (1, 32768, 2048) bf16 (its tensor pipe's share,
#    occupancy and stalls: the plan's first step before any restructuring).
set -u
cd "$(dirname "$0")/../../../.."
STAGES="${STAGES:-tests prof ncu}"
. scripts/stage.sh
workspace call3.log
stage tests 60 $PY -m pytest -q -p no:cacheprovider --tb=short tests/test_train.py -k compile_on 2>&1 | tail -3
stage prof 170 $PY results/dev/session8/scripts/trainprof.py s15 2>&1 | grep -v "^\s*$" | tail -34
save
OUT="$W/ncu" stage ncu 250 bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel
rm -f "$W"/ncu/ncu.tar.gz
grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Compute \(SM\) Throughput|Memory Throughput|\
Executed Ipc A|Issue Slots Busy|Block Limit|Dynamic Shared|Local Memory Spilling" "$W"/ncu/ncu/_rglru_bwd_dw_kernel.txt | head -30
save
