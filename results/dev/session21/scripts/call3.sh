#!/usr/bin/env bash
# Session 21, call 3 (call 2 got no answer from the machine): RG-LRU's GPU tests on HEAD in three processes beside
# the three trees' compiles; then HEAD (5e5ceca: the weight-gradient pass unpipelined), tA (b8947da: LEANER at 96
# and fp16, dW pipelined) and tprev (4b424ed) timed alternately (head, tA, tprev, head2) in bf16 at L = 32,768 and
# head dims 96, 128, 160, fp16 at 128 and 160 (head, tprev); HEAD's packed ratios.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
H=5e5ceca49ded417eeb97cf0099319e2a5c307318; A=b8947da04bcaaddd77301e7dda32e4bfac0abca5; P=4b424edd78782ccdbabdc4fa8388404123046a35
python3 -m pytest -q --collect-only -m gpu tests/ops/test_rglru_triton.py 2>/dev/null | grep "::" > $W/gpu_tests.txt
for k in 0 1 2; do
  awk -v k=$k 'NR % 3 == k' $W/gpu_tests.txt > $W/gpu_tests-$k.txt
  (timeout -s INT -k 10 320 python3 -m pytest -q -p no:cacheprovider --tb=short $(cat $W/gpu_tests-$k.txt) > $W/gpu_tests-$k.log 2>&1; echo "tests $k exit $?") &
done
WARM="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
for dt, D, docs in [(torch.bfloat16, 1536, 0), (torch.bfloat16, 2048, 0), (torch.bfloat16, 2560, 0), (torch.float16, 2048, 0), (torch.float16, 2560, 0), (torch.bfloat16, 2048, 16)]:
    make('rglru', (1, 4096, D), 'triton_chunked', dtype=dt, documents=docs)[1]()
torch.cuda.synchronize(); print('warm')"
for t in head tA tprev; do d=$t; [ $t = head ] && d=.; (cd $d && PYTHONPATH=$PWD timeout 200 python3 -c "$WARM" > $W/warm-$t.log 2>&1; echo "warm $t $?") & done
wait
tail -n 2 $W/gpu_tests-*.log
tar -czf $OUT/results.tar.gz -C $W .
SW="1,32768,1536;1,32768,2048;1,32768,2560"
prof() {  # TAG DIR COMMIT DTYPE SHAPES
  mkdir -p $W/prof-$1
  (cd "$2" && PYTHONPATH="$PWD" SAMU_GIT_COMMIT="$3" timeout 60 python3 scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --dtype "$4" --out "$W/prof-$1" --shapes "$5" > "$W/prof-$1.log" 2>&1; echo "$1 exit $?")
}
prof head . $H bfloat16 "$SW"; prof tA tA $A bfloat16 "$SW"; prof tprev tprev $P bfloat16 "$SW"; prof head2 . $H bfloat16 "$SW"
prof head16 . $H float16 "1,32768,2048;1,32768,2560"; prof tprev16 tprev $P float16 "1,32768,2048;1,32768,2560"
mkdir -p $W/packed-head
(PYTHONPATH=$PWD SAMU_GIT_COMMIT=$H timeout 60 python3 scripts/gpu_packed_profile.py --ops rglru --documents 16,256 --out $W/packed-head > $W/packed-head.log 2>&1; echo packed-head $?)
tar -czf $OUT/results.tar.gz -C $W .
python3 - $W <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/prof-*/*.json")):
    r = json.load(open(p))
    print(p.split("/")[-2], " ".join(f"{tuple(s['shape'])}:{s['fb_graph_ms']:.3f}" for s in r["rows"]))
PY
grep -h "^== " $W/packed-head.log
