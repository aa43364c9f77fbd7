#!/usr/bin/env bash
# Session 19, call 4: Nsight Compute where the packed RG-LRU backward still loses time (issue 15: its weight-gradient
# kernel is +11% packed, 1,490 against 1,340 us, at (1, 32768, 2048)), and on SAMU's forward summary kernel (issue 12,
# plan item 2: what its serial tail waits on). One full-set profile each: RG-LRU's _rglru_bwd_dw_kernel unpacked and
# packed into 16 sequences, SAMU's _summary_kernel.
#   bash results/dev/session19/scripts/call4.sh        (writes $OUT/ncu.tar.gz and one log)
set -u
cd "$(dirname "$0")/../../../.."
OUT="${OUT:-$PWD/out}"
export OUT
{
  DOCUMENTS= bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel
  DOCUMENTS=16 bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel
  bash scripts/gpu_ncu.sh samu triton_grouped 1,32768,2048 _summary_kernel
  tar -czf "$OUT/ncu.tar.gz" -C "$OUT" ncu && rm -rf "$OUT/ncu"
} 2>&1 | tee "$OUT/call4.log"
