"""LanguageModel: token embedding, a stack of residual layers, final RMSNorm, tied output head."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from samu.models.config import LMConfig
from samu.modules.block import BlockState, ResidualLayer
from samu.modules.layers import RMSNorm, product_dtype
from samu.ops.checks import local_part
from samu.ops.embedding import embedding
from samu.ops.glue import fused_backend
from samu.ops.linear import linear
from samu.ops.packing import sequence_offsets


class CausalLM(nn.Module):
    """What samu's trainer needs of a language model: forward(tokens [B, L]) -> (logits, state or None), a
    ``config``, an ``activation_checkpointing`` switch, and the two parameter helpers below."""

    @staticmethod
    @torch.no_grad()
    def init_embedding_(embed: nn.Embedding) -> None:
        """Embedding rows of norm ~0.5: through the tied head an untrained model's logits spread by ~0.5 at any
        width, close to a uniform guess (each layer's RMSNorm gives its block unit-RMS input)."""
        nn.init.normal_(embed.weight, std=0.5 * embed.embedding_dim ** -0.5)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def nonfinite_parameters(self) -> list[str]:
        """Names of the parameters holding nan or inf (one host synchronisation when there are none); of a
        sharded model (FSDP), those whose shards in this process do."""
        params = [(n, local_part(p)) for n, p in self.named_parameters()]
        if bool(torch.stack([torch.isfinite(p).all() for _, p in params]).all()):
            return []
        return [name for name, p in params if not bool(torch.isfinite(p).all())]


def _is_process_group(group) -> bool:
    import torch.distributed as dist

    return dist.is_available() and isinstance(group, dist.ProcessGroup)


class LanguageModel(CausalLM):
    """A Griffin-style recurrent language model whose temporal mixer is SAMU or RG-LRU.

    forward(tokens [B, L] int64, state: list[BlockState] | None, return_state, cu_seqlens)
        -> (logits [B, L, vocab_size], list[BlockState] | None); cu_seqlens packs sequences (samu.ops.packing)
    step(token [B] int64, state: list[BlockState] | None) -> (logits [B, vocab_size], a new list[BlockState])
    init_state(batch) -> a zero state; decode(token, state, plan=None) -> logits, updating the state in place
    (decode_plan(batch): which layers take the one-row products, decided once for a decoding loop)

    The state holds one BlockState per layer (conv window + mixer state), independent of L. ``step`` checks
    its arguments and leaves the given state alone; ``decode`` is the decoding loop's unchecked step over
    buffers allocated once (samu.models.generate).

    ``sequence_parallel``: a process group (or None): tokens are then this rank's shard of each sequence,
    split along L across the group in rank order (RecurrentBlock; every parameter's gradient is this rank's
    share: all-reduce them over the group).
    """

    def __init__(self, config: LMConfig, *, backend: str = "auto", device=None, dtype=None,
                 sequence_parallel=None):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be an LMConfig, got {type(config).__name__}")
        if sequence_parallel is not None and not _is_process_group(sequence_parallel):
            raise TypeError(f"sequence_parallel must be a torch.distributed process group or None, got "
                            f"{type(sequence_parallel).__name__}")
        self.config = config
        kw = dict(device=device, dtype=dtype)
        self.embed = nn.Embedding(config.vocab_size, config.width, **kw)
        self.layers = nn.ModuleList(
            ResidualLayer(config.width, config.mixer, config.lru_width, config.num_heads,
                          config.conv_width, config.mlp_expansion, config.norm_eps, backend=backend, **kw)
            for _ in range(config.num_layers))
        self.final_norm = RMSNorm(config.width, config.norm_eps, backend=fused_backend(backend), **kw)
        # recompute each layer's activations in the backward (torch.utils.checkpoint) while grad is on
        self.activation_checkpointing = False
        self._init_weights()
        # a process group: every block's shard of the sequence is this rank's (RecurrentBlock)
        for layer in self.layers:
            layer.block.sequence_parallel = sequence_parallel

    @torch.no_grad()
    def _init_weights(self):
        self.init_embedding_(self.embed)
        # Each of the 2 * num_layers residual branches adds variance 1 / (2 * num_layers) at init.
        scale = (2 * self.config.num_layers) ** -0.5
        for layer in self.layers:
            layer.block.linear_out.weight.mul_(scale)
            layer.mlp.down.weight.mul_(scale)

    def _check_state(self, state):
        if state is not None and (not isinstance(state, (list, tuple)) or len(state) != len(self.layers)):
            raise ValueError(f"state must be a list of {len(self.layers)} BlockStates (one per layer) or None")
        return [None] * len(self.layers) if state is None else state

    def _check_tokens(self, name, tokens, dim):
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tokens).__name__}")
        if tokens.dim() != dim or 0 in tokens.shape:
            want = "[B, L]" if dim == 2 else "[B]"
            raise ValueError(f"{name} must have shape {want} with nonzero sizes, got {list(tokens.shape)}")
        if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"{name} must be a tensor of int64, int32, int16 or uint8 token ids, got {tokens.dtype}")
        # the range on the host only where that costs no synchronisation (CUDA's embedding asserts on the device)
        if tokens.device.type == "cpu" and not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(tokens))
            vocab = self.config.vocab_size
            if low < 0 or high >= vocab:
                raise ValueError(f"{name} must hold integer tokens in [0, {vocab}), got values in [{low}, {high}]")

    def _head(self, x):
        return linear(self.final_norm(x, product_dtype(x)), self.embed.weight)

    def forward(self, tokens, state=None, return_state=False, cu_seqlens=None):
        """``cu_seqlens`` (samu.ops.packing): tokens [1, L] pack N sequences, none seeing another; each
        layer's state then has N rows."""
        self._check_tokens("tokens", tokens, 2)
        states = self._check_state(state)
        if cu_seqlens is not None:
            cu_seqlens = sequence_offsets(cu_seqlens, tokens)   # ints from here on: read once, not per layer
        x = embedding(tokens, self.embed.weight)
        new_states = []
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer, s in zip(self.layers, states):
            if recompute:
                x, s = checkpoint(layer, x, s, return_state, cu_seqlens, use_reentrant=False)
            else:
                x, s = layer(x, s, return_state, cu_seqlens)
            new_states.append(s)
        return self._head(x), (new_states if return_state else None)

    def init_state(self, batch: int, device=None, dtype=None) -> list[BlockState]:
        """A zero state for ``batch`` rows (RecurrentBlock.init_state per layer), on the model's device."""
        return [layer.init_state(batch, device, dtype) for layer in self.layers]

    def decode(self, token, state: list[BlockState], plan: list[bool] | None = None):
        """logits [B, vocab_size] for token [B], updating ``state`` (from init_state) in place; unchecked.
        ``plan``: decode_plan(B) made under the same settings (None: each layer decides at each call)."""
        x = embedding(token, self.embed.weight)
        for layer, s, one_row in zip(self.layers, state, [None] * len(self.layers) if plan is None else plan):
            x = layer.decode(x, s, one_row)
        return self._head(x)

    def decode_plan(self, batch: int) -> list[bool]:
        """Per layer, whether decode() of ``batch`` rows takes the one-row products (ResidualLayer.takes_one_row),
        decided once for a decoding loop: it depends on the batch, the weights' dtypes and layouts, the backends
        and the autocast state, none of which a loop changes. Every layer's input has the embedding's dtype and
        layout (with autocast off, where alone the one-row products run)."""
        x_t = embedding(torch.zeros(batch, dtype=torch.int64, device=self.embed.weight.device), self.embed.weight)
        return [layer.takes_one_row(x_t) for layer in self.layers]

    def step(self, token, state=None):
        self._check_tokens("token", token, 1)
        states = [layer.block.fresh_state(s, token.shape[0]) for layer, s in zip(self.layers, self._check_state(state))]
        return self.decode(token, states), states
