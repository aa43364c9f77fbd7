"""torch.compile of a whole residual layer traces each Triton mixer as one custom op (no graph break).

On CPU the kernels run in the Triton interpreter; the compiled layer must give the eager layer's
output and gradients.
"""

import pytest
import torch

import samu
from samu.ops import dispatch
from tests.helpers import randn, rel_err

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("mixer,backend", [("samu", "triton_serial"), ("samu", "triton_grouped"),
                                           ("rglru", "triton_chunked")])
def test_residual_layer_compiles_in_one_graph(mixer, backend):
    torch.manual_seed(0)
    layer = samu.ResidualLayer(16, mixer=mixer, lru_width=16, num_heads=2, backend=backend).to(DEVICE)
    x = randn((2, 11, 16), 5, device=DEVICE).requires_grad_()

    def loss(x):
        out, _ = layer(x)
        return (out ** 2).sum()

    explanation = torch._dynamo.explain(loss)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    leaves = [x, *layer.parameters()]
    got = torch.autograd.grad(compiled(x), leaves)
    want = torch.autograd.grad(loss(x), leaves)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("mixer,backend", [("samu", "triton_grouped"), ("rglru", "triton_chunked")])
def test_a_packed_model_compiles_in_one_graph(mixer, backend):
    """A packed forward (cu_seqlens an int32 tensor) traces whole: the mixers as their packing custom ops,
    the glue's masked PyTorch taps, the sequence index by searchsorted; the same gradients as the eager
    packed model, for two sets of offsets."""
    from samu.models import LanguageModel, LMConfig

    torch.manual_seed(0)
    model = LanguageModel(LMConfig(vocab_size=11, width=16, num_layers=2, mixer=mixer, num_heads=2),
                          backend=backend).to(DEVICE)
    tokens = torch.randint(0, 11, (1, 23), device=DEVICE)

    def loss(tokens, cu):
        logits, _ = model(tokens, cu_seqlens=cu)
        return (logits ** 2).mean()

    cu = torch.tensor([0, 1, 9, 23], dtype=torch.int32, device=DEVICE)
    explanation = torch._dynamo.explain(loss)(tokens, cu)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    params = list(model.parameters())
    for offsets in (cu, torch.tensor([0, 7, 8, 23], dtype=torch.int32, device=DEVICE)):
        got = torch.autograd.grad(compiled(tokens, offsets), params)
        want = torch.autograd.grad(loss(tokens, offsets), params)
        for a, b in zip(got, want):
            assert rel_err(a, b) < 1e-5
    # offsets given as ints cannot be traced: one line says what to pass instead
    with pytest.raises(Exception, match="pass an int32 tensor to a compiled model"):
        torch.compile(lambda t: model(t, cu_seqlens=[0, 5, 23])[0].sum(), backend="aot_eager")(tokens)
