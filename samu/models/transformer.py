"""TransformerLM: the reference point samu's recurrent models are compared with (``samu compare`` and the
bench's ``sdpa-transformer`` peer): what a user would train instead.

A pre-norm causal transformer on PyTorch's own ``scaled_dot_product_attention`` (FlashAttention on CUDA),
rotary positions (base 10,000), a GeLU MLP of 4 * width, RMSNorm, no biases, a tied head: 12 * width^2
parameters a layer against the recurrent layer's ~12 * width^2, so the two have parameters within 5%.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from samu.models.config import TransformerConfig
from samu.models.model import CausalLM
from samu.modules.layers import Linear, RMSNorm, lecun_normal_, product_dtype
from samu.ops.embedding import embedding
from samu.ops.linear import autocast_dtype, linear
from samu.ops.packing import sequence_offsets


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class _AttentionLayer(nn.Module):
    def __init__(self, width: int, heads: int, **kw):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(width, **kw)
        self.qkv = Linear(width, 3 * width, bias=False, **kw)
        self.proj = Linear(width, width, bias=False, **kw)
        self.mlp_norm = RMSNorm(width, **kw)
        self.up = Linear(width, 4 * width, bias=False, **kw)
        self.down = Linear(4 * width, width, bias=False, **kw)
        for module in (self.qkv, self.proj, self.up, self.down):
            lecun_normal_(module)

    def forward(self, x, cos, sin):
        B, L, W = x.shape
        # the same norms as the recurrent layers' (samu.modules.block.ResidualLayer)
        dtype = product_dtype(x)
        q, k, v = self.qkv(self.attn_norm(x, dtype)).view(B, L, 3, self.heads, W // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x, u = self.mlp_norm.add_norm(x, self.proj(a.transpose(1, 2).reshape(B, L, W)), dtype)
        return x + self.down(F.gelu(self.up(u), approximate="tanh"))


class TransformerLM(CausalLM):
    """forward(tokens [B, L] int64) -> (logits [B, L, vocab_size], None): no recurrent state to carry."""

    def __init__(self, config: TransformerConfig, *, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config must be a TransformerConfig, got {type(config).__name__}")
        self.config = config
        kw = dict(device=device, dtype=dtype)
        self.embed = nn.Embedding(config.vocab_size, config.width, **kw)
        self.init_embedding_(self.embed)
        heads = config.width // config.head_dim
        self.layers = nn.ModuleList(_AttentionLayer(config.width, heads, **kw) for _ in range(config.num_layers))
        self.final_norm = RMSNorm(config.width, **kw)
        self.activation_checkpointing = False

    def forward(self, tokens, state=None, return_state=False, cu_seqlens=None):
        """``cu_seqlens`` (samu.ops.packing): tokens [1, L] pack sequences, each attending to itself alone,
        its positions counted from its own start (one call per sequence)."""
        if state is not None or return_state:
            raise ValueError("a TransformerLM carries no recurrent state: call it without state or return_state")
        if cu_seqlens is not None:
            offsets = sequence_offsets(cu_seqlens, tokens)
            return torch.cat([self(tokens[:, a:b])[0] for a, b in zip(offsets, offsets[1:])], dim=1), None
        L, hd = tokens.shape[1], self.config.head_dim
        inv = 10000.0 ** (-torch.arange(0, hd, 2, device=tokens.device, dtype=torch.float32) / hd)
        angles = torch.arange(L, device=tokens.device, dtype=torch.float32)[:, None] * inv
        x = embedding(tokens, self.embed.weight)
        dtype = autocast_dtype(x.device.type) or x.dtype
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.layers:
            x = checkpoint(layer, x, cos, sin, use_reentrant=False) if recompute else layer(x, cos, sin)
        return linear(self.final_norm(x, product_dtype(x)), self.embed.weight), None
