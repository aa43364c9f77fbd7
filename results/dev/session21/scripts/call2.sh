#!/usr/bin/env bash
# Session 21, call 2: HEAD (5e5ceca: the weight-gradient pass unpipelined), tA (b8947da: LEANER at 96 and fp16, dW
# pipelined) and tprev (4b424ed), timed alternately (head, tA, tprev, head2) at the head dims the change touches, in
# bf16, and in fp16 at (1, 32768, 2048); packed ratios of HEAD and tprev. Each tree compiles first, all side by side.
set -u
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-$PWD/out}
W=$OUT/w; mkdir -p $W
H=5e5ceca49ded417eeb97cf0099319e2a5c307318; A=b8947da04bcaaddd77301e7dda32e4bfac0abca5; P=4b424edd78782ccdbabdc4fa8388404123046a35
WARM="import sys, torch, samu
sys.path.insert(0, 'scripts')
from gpu_profile import make
samu.set_check_finite(False)
for dt, D, docs in [(torch.bfloat16, 1536, 0), (torch.bfloat16, 2048, 0), (torch.bfloat16, 2560, 0), (torch.float16, 2048, 0), (torch.bfloat16, 2048, 16)]:
    make('rglru', (1, 4096, D), 'triton_chunked', dtype=dt, documents=docs)[1]()
torch.cuda.synchronize(); print('warm')"
for t in . tA tprev; do (cd $t && PYTHONPATH=$PWD timeout 200 python3 -c "$WARM" > $W/warm-${t//./head}.log 2>&1; echo "warm $t $?") & done
wait
SW="1,32768,1536;1,32768,2048;1,32768,2560;4,2048,2048"
prof() {  # TAG DIR COMMIT DTYPE SHAPES
  (cd "$2" && PYTHONPATH="$PWD" SAMU_GIT_COMMIT="$3" timeout 90 python3 scripts/gpu_profile.py --op rglru \
    --backend triton_chunked --dtype "$4" --out "$W/prof-$1" --shapes "$5" > "$W/prof-$1.log" 2>&1; echo "$1 exit $?")
}
for t in head tA tprev head2 head16 tprev16; do mkdir -p $W/prof-$t; done
prof head . $H bfloat16 "$SW"; prof tA tA $A bfloat16 "$SW"; prof tprev tprev $P bfloat16 "$SW"; prof head2 . $H bfloat16 "$SW"
prof head16 . $H float16 "1,32768,2048"; prof tprev16 tprev $P float16 "1,32768,2048"
mkdir -p $W/packed-head $W/packed-tprev
(PYTHONPATH=$PWD SAMU_GIT_COMMIT=$H timeout 80 python3 scripts/gpu_packed_profile.py --ops rglru --documents 16,256 --out $W/packed-head > $W/packed-head.log 2>&1; echo packed-head $?)
(cd tprev && PYTHONPATH=$PWD SAMU_GIT_COMMIT=$P timeout 80 python3 scripts/gpu_packed_profile.py --ops rglru --documents 16,256 --out $W/packed-tprev > $W/packed-tprev.log 2>&1; echo packed-tprev $?)
tar -czf $OUT/results.tar.gz -C $W .
python3 - $W <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/prof-*/*.json")):
    r = json.load(open(p))
    print(p.split("/")[-2], " ".join(f"{tuple(s['shape'])}:{s['fb_graph_ms']:.3f}" for s in r["rows"]))
PY
for t in head tprev; do echo "$t"; grep -h "^== " $W/packed-$t.log; done
