"""Language models timed beside samu's in the ``model`` scope: what a user would train instead.

* ``sdpa-transformer``: samu.models.TransformerLM, a pre-norm transformer on PyTorch's own
  ``scaled_dot_product_attention`` (FlashAttention on CUDA); the width, depth and vocabulary of the samu
  preset, parameters within 5% of it (12·w² a layer against samu's ~12·w²).
* ``fla-hgrn``, ``fla-gla``: flash-linear-attention's HGRN and GLA language models (``fla.models``,
  package ``flash-linear-attention``), when it is installed; the preset's width, depth and vocabulary,
  a SwiGLU MLP of 3·w (the parameters of samu's GeGLU), tied head. Their temporal layers hold 4·w²
  (samu's block 3·w²), so they are ~8% larger: the record gives each candidate's count.

Every model's forward takes tokens [B, L] and returns (logits [B, L, vocab], None), as samu's does.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from samu.models import TransformerConfig, TransformerLM

MODEL_PEERS = ("sdpa-transformer", "fla-hgrn", "fla-gla")


class _HFCausalLM(nn.Module):
    """A Hugging Face causal LM as (logits, None) of tokens."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens).logits, None


def unavailable(name: str, device) -> "str | None":
    """Why model peer ``name`` cannot run here, or None."""
    if name == "sdpa-transformer":
        return None
    if torch.device(device).type != "cuda":
        return "flash-linear-attention's kernels need CUDA"
    try:
        import fla.models  # noqa: F401
    except Exception as err:  # noqa: BLE001  (any import failure means: not installed here)
        return f"flash-linear-attention (fla.models) is not importable: {type(err).__name__}: {err}"[:300]
    return None


def build(name: str, vocab_size: int, width: int, num_layers: int, device) -> nn.Module:
    """Model peer ``name`` (``MODEL_PEERS``) of the given shape, on ``device``."""
    if name == "sdpa-transformer":
        return TransformerLM(TransformerConfig(vocab_size, width, num_layers), device=device)
    if name not in MODEL_PEERS:
        raise ValueError(f"model peer must be one of {', '.join(MODEL_PEERS)}, got {name!r}")
    import fla.models as fm

    common = dict(hidden_size=width, num_hidden_layers=num_layers, vocab_size=vocab_size,
                  intermediate_size=3 * width, tie_word_embeddings=True, fuse_cross_entropy=False)
    if name == "fla-hgrn":
        model = fm.HGRNForCausalLM(fm.HGRNConfig(**common))
    else:
        # key head dim 64, value head dim 128 (expand_k 0.5)
        model = fm.GLAForCausalLM(fm.GLAConfig(num_heads=max(1, width // 128), **common))
    return _HFCausalLM(model.to(device))
