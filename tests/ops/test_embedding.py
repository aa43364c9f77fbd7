"""samu.ops.embedding against F.embedding and float64.

Rule, declared before any run: the forward is F.embedding's to the bit; the weight gradient of a small
vocabulary is within 1e-6 (relative Frobenius) of the float64 sums in fp32 and the same bits in two calls;
a vocabulary above ONE_HOT_VOCAB is F.embedding (its gradient too) to the bit; compiled equals eager.
"""

import pytest
import torch
import torch.nn.functional as F

from samu.ops.embedding import ONE_HOT_VOCAB, embedding
from tests.helpers import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(vocab, dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (3, 41), generator=g).to(dtype).to(DEVICE)
    weight = torch.randn(vocab, 24, generator=g).to(DEVICE).requires_grad_()
    dy = torch.randn(3, 41, 24, generator=g).to(DEVICE)
    return tokens, weight, dy


def _grad(fn, tokens, weight, dy):
    weight.grad = None
    y = fn(tokens, weight)
    y.backward(dy)
    return y.detach(), weight.grad.clone()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_small_vocabulary_gradient_is_the_exact_sums_and_repeats(dtype):
    tokens, weight, dy = _case(200, dtype)
    y, dw = _grad(embedding, tokens, weight, dy)
    assert torch.equal(y, F.embedding(tokens.long(), weight.detach()))
    exact = torch.zeros(200, 24, dtype=torch.float64, device=DEVICE).index_add_(
        0, tokens.reshape(-1).long(), dy.double().reshape(-1, 24))
    assert rel_err(dw, exact) < 1e-6
    assert torch.equal(dw, _grad(embedding, tokens, weight, dy)[1])


def test_a_large_vocabulary_is_f_embedding():
    tokens, weight, dy = _case(ONE_HOT_VOCAB + 1)
    for a, b in zip(_grad(embedding, tokens, weight, dy), _grad(F.embedding, tokens, weight, dy)):
        assert torch.equal(a, b)


def test_compiled_equals_eager():
    tokens, weight, dy = _case(256)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    eager = _grad(embedding, tokens, weight, dy)
    compiled = _grad(torch.compile(embedding, backend=backend, fullgraph=True), tokens, weight, dy)
    assert torch.equal(compiled[0], eager[0]) and rel_err(compiled[1], eager[1]) < 1e-6
