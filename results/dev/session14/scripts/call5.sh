#!/usr/bin/env bash
# Session 14, call 5 (issues 12 and 13: both mixers' kernels at this commit, the baseline for the next changes).
# From the repository root:
#   SAMU_GIT_COMMIT=<HEAD's full hex> PYTHONPATH=$PWD bash results/dev/session14/scripts/call5.sh
set -u
cd "$(dirname "$0")/../../../.."
STAGES="profile"
. scripts/stage.sh
workspace call5.log
SHAPES="1,8192,1024;4,2048,2048;1,32768,2048"
stage profile 70 $PY scripts/gpu_profile.py --op samu --backend triton_grouped --out "$W" --shapes "$SHAPES" 2>&1 | tail -4
save
stage profile 70 $PY scripts/gpu_profile.py --op rglru --backend triton_chunked --out "$W" --shapes "$SHAPES" 2>&1 | tail -4
save
$PY - "$W" <<'PYEOF'
import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/profile_*.json")):
    rec = json.load(open(path))
    for s in rec["rows"]:
        top = ", ".join(f"{name} x{n} {us:.0f} us" for name, n, us in s["kernels"][:4])
        print(f"{path.rsplit('/', 1)[-1]:34} {str(s['shape']):18s} graph {s['fb_graph_ms']:.3f} ms, "
              f"host {s['fb_host_ms']:.3f} ms; {top}")
PYEOF
