#!/usr/bin/env bash
# Session 21, call 3 (never ran: no machine was lent; written for the next session): RG-LRU's GPU tests on HEAD in
# three processes beside the trees' compiles, then HEAD and tprev timed alternately (head, tprev, head: the profile
# stage of scripts/gpu_change.sh) in bf16 at L = 32,768 and head dims 96, 128, 160 and in fp16 at 64, 96, 128 and
# 160, and t96 (4b424ed: no LEANER entry at head dim 96) in bf16 at (1, 32768, 1536), the time the shipped entries
# there were never set against. Limits: tests 250 s beside the compiles, then 6 profiles of at most 60 s and one.
#   HEAD: the shipped code with patches/leaner_fp16_dw.diff applied and committed; tprev: the shipped code, t96:
#   4b424ed (`git archive C samu tests scripts | tar -x -C tprev`, untracked; t96's gpu_profile.py has no --dtype).
#   HEAD_COMMIT=<hex> PREV_COMMIT=<hex> bash results/dev/session21/scripts/call3.sh
set -u
cd "$(dirname "$0")/../../../.."
: "${HEAD_COMMIT:?}" "${PREV_COMMIT:?}"
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
python3 -m pytest -q --collect-only -m gpu tests/ops/test_rglru_triton.py 2>/dev/null | grep "::" > $W/gpu_tests.txt
pids=()
for k in 0 1 2; do
  awk -v k=$k 'NR % 3 == k' $W/gpu_tests.txt > $W/gpu_tests-$k.txt
  (timeout -s INT -k 10 250 python3 -m pytest -q -p no:cacheprovider -m gpu --tb=short $(cat $W/gpu_tests-$k.txt) \
    > $W/gpu_tests-$k.log 2>&1; echo "tests $k exit $?") &
  pids+=($!)
done
WARM="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
for dt, D in [(torch.bfloat16, 1536), (torch.bfloat16, 2048), (torch.bfloat16, 2560), (torch.float16, 1024),
              (torch.float16, 1536), (torch.float16, 2048), (torch.float16, 2560)]:
    make('rglru', (1, 4096, D), 'triton_chunked', dtype=dt)[1]()
torch.cuda.synchronize(); print('warm')"
for t in head tprev t96; do d=$t; [ $t = head ] && d=.; (cd $d && PYTHONPATH=$PWD timeout 200 python3 -c "$WARM" > $W/warm-$t.log 2>&1; echo "warm $t $?") & pids+=($!); done
for p in "${pids[@]}"; do wait $p; done
tail -qn 1 $W/gpu_tests-*.log
tar -czf $OUT/results.tar.gz -C $W .
# the timing: scripts/gpu_change.sh's profile stage (HEAD, tprev, HEAD), bf16 then fp16, each in a folder of its own
PROF=(env STAGES=profile PROFILE_LIMIT=60 SAMU_GIT_COMMIT=$HEAD_COMMIT OLD_COMMIT=$PREV_COMMIT)
OUT=$OUT/bf16 "${PROF[@]}" SHAPES="1,32768,1536;1,32768,2048;1,32768,2560" bash scripts/gpu_change.sh rglru tprev \
  | grep "fb graph"
OUT=$OUT/fp16 "${PROF[@]}" SHAPES="1,32768,1024;1,32768,1536;1,32768,2048;1,32768,2560" \
  PROFILE_ARGS="--dtype float16" bash scripts/gpu_change.sh rglru tprev | grep "fb graph"
# t96: the shipped head-dim-96 entries against neither (its gpu_profile.py has no --dtype: bf16)
mkdir -p $W/prof-t96
(cd t96 && PYTHONPATH=$PWD SAMU_GIT_COMMIT=4b424edd78782ccdbabdc4fa8388404123046a35 timeout 60 python3 \
  scripts/gpu_profile.py --op rglru --backend triton_chunked --out $W/prof-t96 --shapes "1,32768,1536" \
  > $W/prof-t96.log 2>&1; echo "t96 exit $?"; grep "fb graph" $W/prof-t96.log)
tar -czf $OUT/results.tar.gz -C $OUT w bf16/w fp16/w
rm -rf $OUT/w $OUT/bf16/w $OUT/fp16/w $OUT/bf16/results.tar.gz $OUT/fp16/results.tar.gz
