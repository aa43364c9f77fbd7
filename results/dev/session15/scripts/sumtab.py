"""Session 15 (issue 10): `samu train` (400m, 4 x 2048, compiled, the weights' bf16 copies on), timed like session
12's optab.py (which this runs), with the MLP's gate_up product and GeGLU gate as one unit whose bias gradient comes
out of the GeGLU backward kernel ("fused", as shipped) or as the product then the gate, the bias gradient a sum over
dz of its own ("split": samu.modules.layers.linear_geglu replaced by that composition).
Usage: python sumtab.py TAG fused|split [STEPS]; writes $W/optab_TAG.json."""
import os
import runpy
import sys

import samu.modules.layers as layers

tag, mode = sys.argv[1], sys.argv[2]
if mode == "split":
    # the module bound as a default: runpy replaces __main__, where Dynamo would look a global up
    layers.linear_geglu = lambda x, w, b, low, backend, L=layers: L.geglu(L.linear(x, w, b, low), backend)
elif mode != "fused":
    raise SystemExit(f"mode must be fused or split, got {mode!r}")
here = os.path.dirname(os.path.abspath(__file__))
sys.argv = [os.path.join(here, "lowtab.py"), tag, "low", sys.argv[3] if len(sys.argv) > 3 else "100"]
runpy.run_path(sys.argv[0], run_name="__main__")
