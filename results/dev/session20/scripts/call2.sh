#!/usr/bin/env bash
# Session 20, call 2 (issues 13, 15, 11): _tile_ptrs (8317ffe) timed against the tree before it, and what it leaves.
# tprev/ = 99c6f30's tree, untracked (git archive 99c6f30 samu tests scripts | tar -x -C tprev).
#   HEAD_COMMIT=<8317ffe's full hex> bash results/dev/session20/scripts/call2.sh
# 1. gpu_packed_profile.py --ops rglru (unpacked, 16 and 256 sequences at (1, 32768, 2048)): HEAD, tprev, HEAD,
#    each tree with its own SAMU_GIT_COMMIT;
# 2. the bf16 batch-1 decode test (issue 11's review item), never run on a GPU before;
# 3. Nsight Compute on the weight-gradient kernel as it now is, unpacked and packed into 16 sequences.
set -u
cd "$(dirname "$0")/../../../.."
. scripts/stage.sh
STAGES="profile tests ncu"
workspace call2.log
summary() {
  $PY - "$W/prof_$1/packed_profile.json" "$1" <<'PY'
import json, sys
try:
    rows = {r["documents"]: r for r in json.load(open(sys.argv[1]))["rows"] if r["op"] == "rglru"}
except (OSError, KeyError, ValueError):
    sys.exit(print(f"== {sys.argv[2]}: no record"))
us = lambda r, part="": sum(u for name, _, u in r["kernels"] if part in name)
print(f"== {sys.argv[2]}: kernel sums " + " / ".join(f"{us(rows[n]):.0f}" for n in sorted(rows)) + " us; packed/unpacked "
      + " / ".join(f"{us(rows[n]) / us(rows[0]):.3f}" for n in sorted(rows) if n)
      + "".join(f"; {k} " + " / ".join(f"{us(rows[n], k):.0f}" for n in sorted(rows))
                for k in ("dw_kernel", "dx_kernel", "chunk_kernel", "summary_kernel")))
PY
}
for t in head tprev head2; do
  root=$PWD; commit=$HEAD_COMMIT
  [ $t = tprev ] && root=$PWD/tprev && commit=99c6f30055d67fcf8e2a9fb7b437458aae8e998f
  mkdir -p $W/prof_$t
  stage profile 80 env PYTHONPATH=$root SAMU_GIT_COMMIT=$commit $PY $root/scripts/gpu_packed_profile.py --ops rglru \
    --documents 16,256 --out $W/prof_$t > $W/prof_$t.log 2>&1
  save
  summary $t
done
stage tests 100 $PY -m pytest -q -m gpu --tb=short tests/models/test_generate.py -k bf16 > $W/decode_test.log 2>&1
tail -5 $W/decode_test.log
save
stage ncu 120 env OUT=$OUT DOCUMENTS= bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel
stage ncu 120 env OUT=$OUT DOCUMENTS=16 bash scripts/gpu_ncu.sh rglru triton_chunked 1,32768,2048 _rglru_bwd_dw_kernel
save
rm -rf "$OUT/ncu"
echo "== done"
