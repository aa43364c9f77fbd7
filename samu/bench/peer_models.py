"""Language models timed beside samu's in the ``model`` scope: what a user would train instead.

* ``sdpa-transformer``: a pre-norm transformer on PyTorch's own ``scaled_dot_product_attention``
  (FlashAttention on CUDA), rotary positions, GeLU MLP 4x, RMSNorm, tied head; the width, depth and
  vocabulary of the samu preset, parameters within 5% of it (12·w² a layer against samu's ~12·w²).
* ``fla-hgrn``, ``fla-gla``: flash-linear-attention's HGRN and GLA language models (``fla.models``,
  package ``flash-linear-attention``), when it is installed; the preset's width, depth and vocabulary,
  a SwiGLU MLP of 3·w (the parameters of samu's GeGLU), tied head. Their temporal layers hold 4·w²
  (samu's block 3·w²), so they are ~8% larger: the record gives each candidate's count.

Every model's forward takes tokens [B, L] and returns (logits [B, L, vocab], None), as samu's does.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from samu.modules.layers import RMSNorm, lecun_normal_

MODEL_PEERS = ("sdpa-transformer", "fla-hgrn", "fla-gla")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _AttentionLayer(nn.Module):
    def __init__(self, width: int, heads: int, device=None):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(width, device=device)
        self.qkv = nn.Linear(width, 3 * width, bias=False, device=device)
        self.proj = nn.Linear(width, width, bias=False, device=device)
        self.mlp_norm = RMSNorm(width, device=device)
        self.up = nn.Linear(width, 4 * width, bias=False, device=device)
        self.down = nn.Linear(4 * width, width, bias=False, device=device)
        for linear in (self.qkv, self.proj, self.up, self.down):
            lecun_normal_(linear)

    def forward(self, x, cos, sin):
        B, L, W = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, L, 3, self.heads, W // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, L, W))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x)), approximate="tanh"))


class SDPATransformer(nn.Module):
    """Pre-norm causal transformer LM: head dim 128 (64 where the width needs it), RoPE base 10,000."""

    def __init__(self, vocab_size: int, width: int, num_layers: int, device=None):
        super().__init__()
        head_dim = 128 if width % 128 == 0 else 64
        if width % head_dim:
            raise ValueError(f"sdpa-transformer needs a width divisible by 64, got {width}")
        self.head_dim = head_dim
        self.embed = nn.Embedding(vocab_size, width, device=device)
        nn.init.normal_(self.embed.weight, std=0.5 * width ** -0.5)
        self.layers = nn.ModuleList(_AttentionLayer(width, width // head_dim, device) for _ in range(num_layers))
        self.final_norm = RMSNorm(width, device=device)

    def forward(self, tokens):
        L = tokens.shape[1]
        inv = 10000.0 ** (-torch.arange(0, self.head_dim, 2, device=tokens.device, dtype=torch.float32)
                          / self.head_dim)
        angles = torch.arange(L, device=tokens.device, dtype=torch.float32)[:, None] * inv
        x = self.embed(tokens)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        if torch.is_autocast_enabled(x.device.type):
            cos, sin = (t.to(torch.get_autocast_dtype(x.device.type)) for t in (cos, sin))
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.final_norm(x), self.embed.weight), None


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
        return SDPATransformer(vocab_size, width, num_layers, device=device)
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
