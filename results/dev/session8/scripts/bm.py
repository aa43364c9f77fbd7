"""SAMU's main backward at another mode tile (BM) and programs per multiprocessor: fwd + bwd in a CUDA graph and
per-kernel times, settings interleaved (A B C A ...). Exploratory: these configurations are not gated."""
import json, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import torch
import samu
import samu.ops.samu.function as f
import samu.ops.samu.triton_bwd as tb
from gpu_profile import graph_time, kernel_table, make, registers
from samu.environment import environment

samu.set_check_finite(False)
slots0 = tb._slots
settings = [(64, 16), (32, 16), (32, 20), (64, 16), (32, 20)]
shapes = [(1, 32768, 2048), (4, 2048, 2048), (1, 8192, 1024)]
out = []
for BM, per_sm in settings:
    f._tile = lambda D, BM=BM: (min(128, D // 2), min(BM, D // 2))
    tb._slots = lambda device, n_items, _per, p=per_sm: slots0(device, n_items, p)
    for shape in shapes:
        fwd, fb, leaves = make("samu", shape, "triton_grouped")
        ms = graph_time(fb, leaves)
        kt = kernel_table(fb, leaves)
        main = sum(us for name, c, us in kt if name.startswith("_main_kernel"))
        row = dict(BM=BM, per_sm=per_sm, shape=shape, fb_graph_ms=ms, main_us=main, kernels=kt)
        out.append(row)
        print(f"BM={BM:3d} per_sm={per_sm:2d} {str(shape):18s} fb graph {ms:.3f} ms  main {main:6.1f} us", flush=True)
    json.dump({"env": environment("cuda"), "rows": out, "registers": registers(["samu.ops.samu.triton_bwd"])},
              open(os.path.join(os.environ.get("W", "."), "bm.json"), "w"), indent=1, default=str)
