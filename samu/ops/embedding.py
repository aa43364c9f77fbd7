"""Token embedding whose weight gradient is one product: deterministic, and fast for small vocabularies.

An embedding's weight gradient adds each token's output gradient into its row. PyTorch adds them with
atomics (an order that changes from run to run) or, under its deterministic algorithms (what ``samu
train`` runs with, for exact resumption), sorts the tokens first: 1.72 ms a step for the 400m preset at
4 x 2048 on an H200, the largest kernel of that step outside the products and the optimizer
(``results/dev/session8/call4/``). For a vocabulary of at most ``ONE_HOT_VOCAB`` tokens the gradient here
is onehot(tokens)^T dy instead: one product over the tokens in the gradient's dtype (fp32 for fp32
weights), summed in one fixed order, the same in every run with or without the deterministic algorithms.
The product runs with autocast off, wherever the backward is called (torch.compile traces it under the
forward's autocast state); it follows PyTorch's fp32 product precision (TF32 where a caller allows it).
Larger vocabularies take ``F.embedding`` as it is: the [tokens, vocabulary] one-hot and the product's
2 * tokens * vocabulary * width operations grow with the vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops.linear import no_autocast

ONE_HOT_VOCAB = 1024


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(tokens, weight):
        return F.embedding(tokens, weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        tokens, weight = inputs
        ctx.save_for_backward(tokens)
        ctx.vocab = weight.shape[0]

    @staticmethod
    def backward(ctx, dy):
        (tokens,) = ctx.saved_tensors
        with no_autocast(dy.device.type):
            rows = dy.reshape(-1, dy.shape[-1])
            one_hot = (tokens.reshape(-1, 1) == torch.arange(ctx.vocab, device=tokens.device)).to(rows.dtype)
            return None, one_hot.t() @ rows


def embedding(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight [V, W] at integer tokens [...] -> [..., W] (narrow integer dtypes, which F.embedding refuses,
    widened); the weight gradient one product where V <= ONE_HOT_VOCAB (module docstring)."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.dtype not in (torch.int32, torch.int64):
        tokens = tokens.long()
    if weight.shape[0] <= ONE_HOT_VOCAB and weight.requires_grad and torch.is_grad_enabled():
        return _Embedding.apply(tokens, weight)
    return F.embedding(tokens, weight)
