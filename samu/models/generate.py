"""Recurrent generation: prefill with the full forward, then one O(1) step per new token."""

from __future__ import annotations

import torch

from samu.models.model import LanguageModel
from samu.validate import finite_number, nonneg_int, positive_int


def sample(logits: torch.Tensor, temperature: float, top_k: int | None,
           generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``logits`` [B, V]; temperature 0 means greedy."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: LanguageModel, prompt: torch.Tensor, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, seed: int | None = None) -> torch.Tensor:
    """Continue ``prompt`` by ``max_new_tokens`` sampled tokens.

    Args:
        model: a LanguageModel (its device is used).
        prompt: [B, T] or [T] integer tokens, T >= 1.
        max_new_tokens: how many tokens to append (>= 0).
        temperature: softmax temperature; 0 picks the most likely token.
        top_k: sample among the k most likely tokens only (None: all).
        seed: seeds the sampling generator for reproducible samples.

    Returns:
        [B, T + max_new_tokens] (or [T + max_new_tokens] for a 1-D prompt) int64 tokens.
    """
    if not isinstance(model, LanguageModel):
        raise TypeError(f"model must be a LanguageModel, got {type(model).__name__}")
    if not isinstance(prompt, torch.Tensor) or prompt.dim() not in (1, 2) or prompt.numel() == 0:
        shape = list(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
        raise ValueError(f"prompt must be a non-empty [B, T] or [T] tensor of tokens, got {shape}")
    vocab = model.config.vocab_size
    if prompt.is_floating_point() or prompt.is_complex() or prompt.min() < 0 or prompt.max() >= vocab:
        raise ValueError(f"prompt must hold integer tokens in [0, {vocab})")
    nonneg_int("max_new_tokens", max_new_tokens)
    finite_number("temperature", temperature)
    if top_k is not None:
        positive_int("top_k", top_k)
    bad = model.nonfinite_parameters()
    if bad:
        raise ValueError(f"the model's weights hold nan or inf ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                         f"a diverged training run? sample an earlier checkpoint")
    device = next(model.parameters()).device
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    tokens = (prompt.unsqueeze(0) if prompt.dim() == 1 else prompt).to(device=device, dtype=torch.int64)
    was_training = model.training
    model.eval()
    try:
        out = [tokens]
        if max_new_tokens:
            logits, state = model(tokens, return_state=True)
            token = sample(logits[:, -1], temperature, top_k, generator)
            out.append(token[:, None])
            for _ in range(max_new_tokens - 1):
                logits, state = model.step(token, state)
                token = sample(logits, temperature, top_k, generator)
                out.append(token[:, None])
    finally:
        model.train(was_training)
    result = torch.cat(out, dim=1)
    return result[0] if prompt.dim() == 1 else result
