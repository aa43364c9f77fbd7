"""Where the eager block's host time goes at (4, 2048, 2048) bf16 (issue 10: eager 2.15x the graph):
host-only time per fwd+bwd, wall time, graph time, and a cProfile of 20 calls. -> $W/blockhost_<op>.txt"""
import cProfile, io, json, os, pstats, sys
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
import torch
from gpu_block import case
from gpu_profile import graph_time, host_time
from samu.ops.checks import set_check_finite

set_check_finite(False)
W = os.environ["W"]
rec = {}
for op in ("samu", "rglru"):
    step, _, leaves = case(op, (4, 2048, 2048), "fused")
    r = {"host_ms": host_time(step, leaves, iters=30, warmup=3),
         "wall_ms": host_time(step, leaves, iters=30, warmup=3, until_done=True),
         "graph_ms": graph_time(step, leaves)}
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20):
        step()
        for t in leaves:
            t.grad = None
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(30); st.sort_stats("cumulative").print_stats(45)
    open(os.path.join(W, f"blockhost_{op}.txt"), "w").write(s.getvalue())
    rec[op] = r
    print(op, {k: round(v, 3) for k, v in r.items()})
    del step, leaves
    torch.cuda.empty_cache()
json.dump(rec, open(os.path.join(W, "blockhost.json"), "w"), indent=1)
