"""Session 13 (issue 11): where an eager decoding step's host time goes. The 400m preset in bf16, generate()'s
Decoder without its graph, 100 eager steps timed (wall clock, synchronised), then 60 under cProfile; for each mixer
and batch. Writes $W/eagerprof.json and $W/eagerprof_<mixer>_<B>.txt. Usage: python eagerprof.py [B,...]"""
import cProfile, io, json, os, pstats, sys, time
import torch
from samu.models import LanguageModel, LMConfig
from samu.models.generate import decoder

W = os.environ.get("W", ".")
batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,64").split(",")]
out = []
for mixer in ("samu", "rglru"):
    torch.manual_seed(0)
    model = LanguageModel(LMConfig.preset("400m", mixer=mixer), device="cuda").to(torch.bfloat16).eval()
    for B in batches:
        with torch.no_grad():
            prompt = torch.randint(256, (B, 16), device="cuda")
            logits, state = model(prompt, return_state=True)
            dec = decoder(model, B, 0.0, None, False)
            dec.load(torch.arange(B, device="cuda"), state)
            dec.run(model, logits[:, -1], 2, None)
            dec.counter.zero_()
            for _ in range(5):
                dec._step(model)
            torch.cuda.synchronize()
            dec.counter.zero_()
            times = []
            for _ in range(100):
                t = time.perf_counter(); dec._step(model); torch.cuda.synchronize(); times.append(time.perf_counter() - t)
            dec.counter.zero_()
            pr = cProfile.Profile(); pr.enable()
            for _ in range(60):
                dec._step(model)
            torch.cuda.synchronize(); pr.disable()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
            open(os.path.join(W, f"eagerprof_{mixer}_{B}.txt"), "w").write(s.getvalue())
            times.sort()
            row = {"mixer": mixer, "batch": B, "median_ms": times[50] * 1e3, "min_ms": times[0] * 1e3,
                   "max_ms": times[-1] * 1e3}
            out.append(row)
            json.dump(out, open(os.path.join(W, "eagerprof.json"), "w"), indent=1)
            print(f"{mixer:6} B={B:3} eager step median {row['median_ms']:.3f} ms (min {row['min_ms']:.3f}, max "
                  f"{row['max_ms']:.3f})", flush=True)
    del model
    torch.cuda.empty_cache()
