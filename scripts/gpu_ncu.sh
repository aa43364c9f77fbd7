#!/usr/bin/env bash
# Nsight Compute on a mixer's kernels (one H200 call; the Firecracker machine reads the counters):
#
#   bash scripts/gpu_ncu.sh OP BACKEND B,L,D KERNEL...      e.g. samu triton_grouped 1,32768,2048 _main_kernel
#
# Runs one forward + backward three times (scripts/gpu_profile.py's inputs) and profiles the third launch of
# each KERNEL with the full section set, clocks left alone (--clock-control none). A kernel launched more than
# once per forward + backward is counted over all its launches: the third of SAMU's _controller_kernel is the
# second call's forward one, of RG-LRU's _rglru_chunk_kernel the second call's summary pass. Writes, per kernel,
# $OUT/ncu/KERNEL.txt (the details page: throughput, occupancy, warp stall reasons) and KERNEL-source.csv
# (per SASS instruction: executions and stall samples), and $OUT/ncu.tar.gz of the folder (of every run so far).
# DOCUMENTS=N (N > 0) packs the row into N sequences (samu.gates.inputs.document_offsets(L, N, 1), the offsets of
# scripts/gpu_packed_profile.py); the files are then named KERNEL-packedN.
set -u
cd "$(dirname "$0")/.."
OP=${1:?usage: gpu_ncu.sh OP BACKEND B,L,D KERNEL...}
BACKEND=${2:?usage: gpu_ncu.sh OP BACKEND B,L,D KERNEL...}
SHAPE=${3:?usage: gpu_ncu.sh OP BACKEND B,L,D KERNEL...}
shift 3
[ $# -gt 0 ] || { echo "usage: gpu_ncu.sh OP BACKEND B,L,D KERNEL..."; exit 2; }
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT/ncu"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "gpu_ncu.sh: no ncu on this machine (PATH or /opt/nvidia/nsight-compute)"; exit 1; }
DRIVER="import sys; sys.path.insert(0, 'scripts'); import torch, samu; from gpu_profile import make
samu.set_check_finite(False)
_, fb, leaves = make('$OP', tuple(int(v) for v in '$SHAPE'.split(',')), '$BACKEND', documents=${DOCUMENTS:-0})
for _ in range(3):
    fb()
    for t in leaves: t.grad = None
torch.cuda.synchronize()"
failed=0
for kernel in "$@"; do
  name=$kernel; [ "${DOCUMENTS:-0}" != 0 ] && name=$kernel-packed$DOCUMENTS
  echo "=== $name"
  if ! timeout 240 "$NCU" --clock-control none --set full --import-source no -k "regex:^${kernel}\$" --launch-skip 2 \
      --launch-count 1 -f -o "$OUT/ncu/$name" python3 -c "$DRIVER" > "$OUT/ncu/$name.log" 2>&1 \
      || [ ! -f "$OUT/ncu/$name.ncu-rep" ]; then
    echo "ncu failed for $name:"; tail -5 "$OUT/ncu/$name.log"; failed=$((failed + 1)); continue
  fi
  tail -2 "$OUT/ncu/$name.log"
  "$NCU" --import "$OUT/ncu/$name.ncu-rep" --page details > "$OUT/ncu/$name.txt" 2>&1
  "$NCU" --import "$OUT/ncu/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu/$name-source.csv" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Memory Throughput" \
    "$OUT/ncu/$name.txt" | head -12
done
rm -f "$OUT"/ncu/*.ncu-rep
tar -czf "$OUT/ncu.tar.gz" -C "$OUT" ncu
[ "$failed" -eq 0 ] || { echo "$failed of $# kernels not profiled"; exit 1; }
