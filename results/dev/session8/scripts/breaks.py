"""Graph breaks of the SAMU LM (tiny preset) under bf16 autocast on CUDA: torch._dynamo.explain."""
import sys
import torch
from samu.models import LanguageModel, LMConfig

model = LanguageModel(LMConfig.preset("tiny"), device="cuda")
tokens = torch.randint(0, 256, (2, 64), device="cuda")


def loss(t):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(t)[0]
    return logits.float().square().mean()


e = torch._dynamo.explain(loss)(tokens)
print(f"{sys.argv[1]}: graphs {e.graph_count} breaks {e.graph_break_count}")
for r in e.break_reasons[:3]:
    print("  ", str(r.reason)[:160])
