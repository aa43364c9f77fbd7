"""Session 14 (issue 10): `samu train` (400m, 4 x 2048, compiled) with Inductor's CUDA graphs (what
torch.compile(mode="reduce-overhead") turns on), timed like session 12's optab.py (which this runs).
Usage: python cgtab.py TAG [STEPS]; writes $W/optab_TAG.json."""
import os
import runpy
import sys

import torch._inductor.config as inductor

inductor.triton.cudagraphs = True
here = os.path.dirname(os.path.abspath(__file__))
optab = os.path.join(here, "..", "..", "session12", "scripts", "optab.py")
sys.argv = [optab, sys.argv[1], "kernels", sys.argv[2] if len(sys.argv) > 2 else "100"]
runpy.run_path(optab, run_name="__main__")
