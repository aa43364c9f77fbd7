"""Session 17: the SAMU profiles of call 1's runs side by side (graph fwd + bwd per shape, kernel times at the last
shape, registers). Usage: python proftab.py W (the folders W/prof_<run>)."""
import glob
import json
import os
import sys

w = sys.argv[1]
runs = {}
for d in sorted(glob.glob(os.path.join(w, "prof_*"))):
    f = glob.glob(os.path.join(d, "profile_samu_*.json"))
    if f:
        runs[os.path.basename(d)[5:]] = json.load(open(f[0]))
if not runs:
    sys.exit("no profiles")
print("fb graph ms: " + "  ".join(f"{r}: " + "/".join(f"{row['fb_graph_ms']:.3f}" for row in p["rows"])
                                  for r, p in runs.items()))
names = [k[0] for k in next(iter(runs.values()))["rows"][-1]["kernels"]]
print("kernel us at " + str(next(iter(runs.values()))["rows"][-1]["shape"]) + ": " + " ".join(f"{r:>8}" for r in runs))
for n in names:
    cells = []
    for p in runs.values():
        t = {k[0]: k[2] for k in p["rows"][-1]["kernels"]}
        cells.append(f"{t.get(n, float('nan')):8.1f}")
    print(f"{n:26}" + " ".join(cells))
for r, p in runs.items():
    print(r, sorted({(k[0], k[1], k[2]) for k in p["registers"]}))
