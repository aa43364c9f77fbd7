"""On CUDA, a compiled language model traces each mixer as one custom op: no graph breaks.

Dispatch reads the gate status without touching the file system inside the trace, and the shapes
below are in the gate set, so the committed status (or the one named by SAMU_GATE_STATUS) covers
them: an ungated class would be an error here, never a silent slow path.
"""

import pytest
import torch

from samu.models import LanguageModel, LMConfig
from samu.ops import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")]


@pytest.mark.parametrize("L", [8192, 65536])
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_two_layer_lm_of_width_2048_compiles_without_graph_breaks(mixer, L):
    torch._dynamo.reset()
    model = LanguageModel(LMConfig(width=2048, num_layers=2, mixer=mixer), device="cuda")
    tokens = torch.randint(0, 256, (1, L), device="cuda")
    choice = dispatch.choose(mixer, 1, L, 2048, torch.bfloat16, "cuda")
    assert choice.backend == "triton", choice.reason

    def loss(tokens):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, _ = model(tokens)
        return logits.float().logsumexp(-1).mean()

    explanation = torch._dynamo.explain(loss)(tokens)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
