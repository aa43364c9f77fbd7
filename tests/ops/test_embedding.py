"""samu.ops.embedding against F.embedding and float64.

Rule, declared before any run: the forward is F.embedding's to the bit; the weight gradient of a vocabulary
up to ONE_HOT_VOCAB comes from the one-product path and is within 1e-6 (relative Frobenius) of the float64
sums in fp32, eager or compiled, with autocast on or off around the forward and the backward, and the same bits
in two calls; a larger vocabulary is F.embedding (its gradient too) to the bit; non-integer tokens are refused.
"""

import pytest
import torch
import torch.nn.functional as F

from samu.ops.embedding import ONE_HOT_VOCAB, embedding
from tests.helpers import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(vocab, dtype=torch.int64, shape=(3, 41), seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, shape, generator=g).to(dtype).to(DEVICE)
    weight = torch.randn(vocab, 24, generator=g).to(DEVICE).requires_grad_()
    dy = torch.randn(*shape, 24, generator=g).to(DEVICE)
    return tokens, weight, dy


def _grad(fn, tokens, weight, dy, autocast=False):
    weight.grad = None
    with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
        y = fn(tokens, weight)
        y.backward(dy)
    return y.detach(), weight.grad.clone(), type(y.grad_fn).__name__


def _exact(tokens, dy, vocab):
    return torch.zeros(vocab, dy.shape[-1], dtype=torch.float64, device=DEVICE).index_add_(
        0, tokens.reshape(-1).long(), dy.double().reshape(-1, dy.shape[-1]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_small_vocabulary_gradient_is_the_exact_sums(dtype):
    tokens, weight, dy = _case(200, dtype)
    y, dw, node = _grad(embedding, tokens, weight, dy)
    assert node == "_EmbeddingBackward"
    assert torch.equal(y, F.embedding(tokens.long(), weight.detach()))
    assert rel_err(dw, _exact(tokens, dy, 200)) < 1e-6


def test_many_tokens_in_few_rows_repeat_to_the_bit():
    # thousands of tokens a row: the summation order shows in the bits if it moves
    tokens, weight, dy = _case(3, shape=(2, 4000))
    a, b = _grad(embedding, tokens, weight, dy)[1], _grad(embedding, tokens, weight, dy)[1]
    assert torch.equal(a, b) and rel_err(a, _exact(tokens, dy, 3)) < 1e-6


@pytest.mark.parametrize("vocab,node", [(ONE_HOT_VOCAB, "_EmbeddingBackward"),
                                        (ONE_HOT_VOCAB + 1, "EmbeddingBackward0")])
def test_the_path_changes_above_the_threshold(vocab, node):
    tokens, weight, dy = _case(vocab)
    got = _grad(embedding, tokens, weight, dy)
    assert got[2] == node
    if node == "EmbeddingBackward0":
        ref = _grad(F.embedding, tokens, weight, dy)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    else:
        assert rel_err(got[1], _exact(tokens, dy, vocab)) < 1e-6


@pytest.mark.parametrize("compiled", [False, True])
def test_autocast_leaves_the_gradient_in_fp32(compiled):
    # torch.compile traces a backward under the forward's autocast state: the product must not drop to bf16
    tokens, weight, dy = _case(256, shape=(2, 512))
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    fn = torch.compile(embedding, backend=backend, fullgraph=True) if compiled else embedding
    y, dw, _ = _grad(fn, tokens, weight, dy, autocast=True)
    assert torch.equal(y, F.embedding(tokens, weight.detach()))
    assert dw.dtype == torch.float32 and rel_err(dw, _exact(tokens, dy, 256)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_non_integer_tokens_are_refused(dtype):
    with pytest.raises(TypeError, match="tokens must be an integer tensor"):
        embedding(torch.zeros(2, 3, dtype=dtype, device=DEVICE), torch.randn(4, 5, device=DEVICE))
