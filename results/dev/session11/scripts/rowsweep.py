"""Session 11: the one-row products' tiles (BN rows a program, BK columns a step) per product shape, in a real
graphed batch-1 decode of the 400m preset (SAMU, bf16): each shape's (BN, BK) tried with the others at the
shipped (8, 512), each config timed as 200 graph replays, the shipped config timed between every shape.
Usage: python rowsweep.py OUT_DIR"""

import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))

from gpu_gen import replay_ms  # noqa: E402
from samu.environment import environment  # noqa: E402
from samu.models import LanguageModel, LMConfig  # noqa: E402
from samu.models.generate import Decoder  # noqa: E402
from samu.ops import rowprod_triton as rp  # noqa: E402

out_dir = sys.argv[1]
TILES = {}   # (N, K) -> (BN, BK)
# as run in session 11 (calls 3 and 4, at 9960ab5) the tiles were module constants rp.BN, rp.BK that this script set
# around each call; since 03449e2 rp.tiles gives them, so the script replaces that function
rp.tiles = lambda N, K, pro: TILES.get((N, K), (8, 512))
torch.manual_seed(0)
model = LanguageModel(LMConfig.preset("400m", mixer="samu"), device="cuda").to(torch.bfloat16).eval()
with torch.no_grad():
    prompt = torch.randint(256, (1, 16), device="cuda")
    logits, state = model(prompt, return_state=True)
rows = torch.arange(1, device="cuda")
layer = model.layers[0]
shapes = sorted({tuple(lin.weight.shape) for lin in layer._products()})
record = {"env": environment(torch.device("cuda")), "shapes": shapes, "rows": []}


def time_config(tiles):
    TILES.clear()
    TILES.update(tiles)
    with torch.no_grad():
        dec = Decoder(model, 1, 0.0, None, True)   # a fresh capture (generate.decoder keeps its first)
        dec.load(rows, state)
        dec.run(model, logits[:, -1], 2, None)
        dec.counter.zero_()
        ms = replay_ms(dec.graph.replay, 200)
    del dec
    return ms


t0 = time.time()
for shape in shapes:
    base = time_config({})
    record["rows"].append({"shape": None, "tiles": [8, 512], "ms": base})
    for BN, BK in itertools.product((4, 8, 16), (256, 512, 1024)):
        if time.time() - t0 > 200:
            break
        ms = time_config({shape: (BN, BK)})
        record["rows"].append({"shape": list(shape), "tiles": [BN, BK], "ms": ms})
        print(f"{shape} BN={BN:2} BK={BK:4} {ms:.4f} ms (base {base:.4f})", flush=True)
        with open(os.path.join(out_dir, "rowsweep.json"), "w") as f:
            json.dump(record, f, indent=1)
best = {}
for r in record["rows"]:
    if r["shape"] and (tuple(r["shape"]) not in best or r["ms"] < best[tuple(r["shape"])][1]):
        best[tuple(r["shape"])] = (tuple(r["tiles"]), r["ms"])
combo = {s: t for s, (t, _) in best.items()}
for _ in range(3):
    record["rows"].append({"shape": "best", "tiles": {str(k): v for k, v in combo.items()}, "ms": time_config(combo)})
    record["rows"].append({"shape": None, "tiles": [8, 512], "ms": time_config({})})
with open(os.path.join(out_dir, "rowsweep.json"), "w") as f:
    json.dump(record, f, indent=1)
for r in record["rows"][-6:]:
    print(r)
