"""Session 15 (issue 10): `samu train` (400m, 4 x 2048, compiled), timed like session 12's optab.py (which this
runs, optimizer kernels on), with the Linear layers' bf16 weight copies written by the optimizer's step ("low", as
shipped) or with autocast casting every weight in every forward ("cast": train._LowWeights told autocast is off).
Usage: python lowtab.py TAG low|cast [STEPS]; writes $W/optab_TAG.json."""
import os
import runpy
import sys

import samu.train as training

tag, mode = sys.argv[1], sys.argv[2]
if mode == "cast":
    lows = training._LowWeights
    training._LowWeights = lambda model, optimizer, autocasts, closing: lows(model, optimizer, False, closing)
elif mode != "low":
    raise SystemExit(f"mode must be low or cast, got {mode!r}")
here = os.path.dirname(os.path.abspath(__file__))
optab = os.path.join(here, "..", "..", "session12", "scripts", "optab.py")
sys.argv = [optab, tag, "kernels", sys.argv[3] if len(sys.argv) > 3 else "100"]
runpy.run_path(optab, run_name="__main__")
# the run's own word on whether its layers took the copies, added to optab's record
import json  # noqa: E402

path = os.path.join(os.environ["W"], f"optab_{tag}.json")
record = json.load(open(path))
record["bf16_weight_copies"] = json.load(open(f"/tmp/runs/{tag}/log.json")).get("bf16_weight_copies")
json.dump(record, open(path, "w"), indent=1)
print(f"{tag}: bf16_weight_copies {record['bf16_weight_copies']}")
