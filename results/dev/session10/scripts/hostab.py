"""Host time of an eager fwd+bwd (1, 8192, 1024) bf16 per mixer, 7 rounds, medians; and one launch's cost.
Usage (from a tree's root): python ab/hostab.py TAG  -> $W/hostab_TAG.json"""
import json, os, sys, time
sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import torch
from gpu_profile import host_time, make
import gpu_host
import samu

tag = sys.argv[1]
rec = {"tag": tag, "ops": {}}
samu.set_check_finite(False)
for op in ("samu", "rglru"):
    fwd, fb, leaves = make(op, (1, 8192, 1024), "auto")
    r = [host_time(fb, leaves, warmup=3) for _ in range(7)]
    rec["ops"][op] = {"rounds": r, "median": sorted(r)[3]}
costs = gpu_host.launch_costs()
rec["launch"] = costs
json.dump(rec, open(os.path.join(os.environ["W"], f"hostab_{tag}.json"), "w"), indent=1)
print(tag, {op: round(v["median"], 4) for op, v in rec["ops"].items()}, {k: round(v, 2) for k, v in costs.items()})
