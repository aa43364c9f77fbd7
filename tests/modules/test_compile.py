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
def test_residual_layer_compiles_in_one_graph(mixer, backend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
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
