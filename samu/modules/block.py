"""Griffin's RecurrentBlock and the residual layer a language model stacks (spec §9)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn as nn

from samu.modules.layers import (Conv1D, GatedMLP, Linear, RMSNorm, check_sequence, check_tensor, check_token,
                                 check_weights_dtype, lecun_normal_, linear_onto, product_dtype)
from samu.modules.mixers import RGLRUMixer, SAMUMixer
from samu.ops.glue import conv_gelu, fused_backend, fused_kernels
from samu.ops.linear import autocast_dtype
from samu.ops.packing import sequence_offsets
from samu.ops.scan import state_dtype
from samu.ops.sequence_parallel import conv_halo
from samu.validate import finite_number, positive_int

MIXERS = ("samu", "rglru")


class BlockState(NamedTuple):
    """Recurrent state of one RecurrentBlock: O(1) in the sequence length."""

    conv: torch.Tensor   # [B, conv_width - 1, lru_width], the last inputs of the Conv1D
    mixer: torch.Tensor  # [B, lru_width] fp32, the mixer state (fused coordinates for SAMU)


class RecurrentBlock(nn.Module):
    """Griffin's temporal block around a SAMU or RG-LRU mixer.

    [z_x | z_y] = u W_in + b_in (W_x and W_y as one GEMM); x = mixer(Conv1D(z_x)); y = GeLU(z_y);
    out = (x * y) W_out + b_out. The Conv1D and the GeLU run as one fused kernel forward and one backward
    on CUDA (samu.ops.glue); ``backend="torch"`` keeps them as PyTorch ops.

    forward(u [B, L, width], state: BlockState | None, return_state, cu_seqlens)
        -> (out [B, L, width], BlockState | None); cu_seqlens packs sequences (samu.ops.packing)
    ``sequence_parallel``: a process group (or None): u is then this rank's shard of a sequence split along
    L across it, in rank order (samu.ops.sequence_parallel: the Conv1D's 3-token halo and the mixer's
    summaries travel between the ranks; each shard at least conv_width - 1 tokens; no state, no packing)
    step(u_t [B, width], state: BlockState | None) -> (out_t [B, width], a new BlockState)
    init_state(batch) -> a zero BlockState; decode(u_t, state) -> out_t, updating the state in place
    """

    def __init__(self, width: int, mixer: str = "samu", lru_width: int | None = None,
                 num_heads: int = 16, conv_width: int = 4, *, backend: str = "auto", device=None,
                 dtype=None):
        super().__init__()
        self.width = positive_int("width", width)
        self.lru_width = positive_int("lru_width", width if lru_width is None else lru_width)
        if mixer not in MIXERS:
            raise ValueError(f"mixer must be one of {', '.join(map(repr, MIXERS))}, got {mixer!r}")
        if mixer == "samu" and self.lru_width % 2:
            raise ValueError(f"lru_width must be even for mixer='samu' (complex modes), got {self.lru_width}")
        # num_heads is RG-LRU's alone; for SAMU it is still checked (a nonsense value would hide a mistake)
        if self.lru_width % positive_int("num_heads", num_heads) and mixer == "rglru":
            raise ValueError(f"num_heads must divide lru_width={self.lru_width}, got {num_heads}")
        positive_int("conv_width", conv_width)
        self.mixer_name = mixer
        kw = dict(device=device, dtype=dtype)
        self.glue_backend = fused_backend(backend)
        # rows [0, E) make z_x, rows [E, 2E) z_y
        self.linear_in = Linear(width, 2 * self.lru_width, **kw)
        self.conv1d = Conv1D(self.lru_width, conv_width, **kw)
        if mixer == "samu":
            self.mixer = SAMUMixer(self.lru_width, backend=backend, device=device)
        else:
            self.mixer = RGLRUMixer(self.lru_width, num_heads, backend=backend, device=device)
        self.linear_out = Linear(self.lru_width, width, **kw)
        for module in (self.linear_in, self.linear_out):
            lecun_normal_(module)
        self.register_load_state_dict_pre_hook(_merge_in_projections)
        self.sequence_parallel = None

    def _unpack(self, state, batch: int):
        if state is None:
            return None, None
        if not isinstance(state, tuple) or len(state) != 2:
            raise TypeError(f"state must be a BlockState (conv, mixer) or None, got {type(state).__name__}")
        conv, mixer = state
        check_tensor("state.conv", conv, (batch, self.conv1d.kernel_size - 1, self.lru_width))
        check_tensor("state.mixer", mixer, (batch, self.lru_width))
        device = self.linear_in.weight.device
        for name, t in (("state.conv", conv), ("state.mixer", mixer)):
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
            if t.device != device:
                raise ValueError(f"{name} is on {t.device}, the block on {device}")
        return conv, mixer

    def forward(self, u, state=None, return_state=False, cu_seqlens=None):
        """With ``cu_seqlens`` (samu.ops.packing), u [1, L, width] packs N sequences: the Conv1D and the mixer
        restart at each boundary (from row n of a state of N rows), and the state returned has N rows."""
        check_sequence("u", u, self.width)
        check_weights_dtype("u", u, self.linear_in.weight)
        if self.sequence_parallel is not None:
            return self._sequence_parallel(u, state, return_state, cu_seqlens)
        z = self.linear_in(u)
        # packed: ints from here on, read once (inside torch.compile, the device tensor)
        offsets = None if cu_seqlens is None else sequence_offsets(cu_seqlens, u)
        conv_state, mixer_state = self._unpack(state, u.shape[0] if offsets is None else len(offsets) - 1)
        x, y, conv_state = conv_gelu(z, self.conv1d.weight, self.conv1d.bias, conv_state, return_state,
                                     self.glue_backend, offsets)
        x, mixer_state = self.mixer(x, mixer_state, return_state, cu_seqlens=offsets)
        out = self.linear_out(x * y)
        return out, (BlockState(conv_state, mixer_state) if return_state else None)

    def _sequence_parallel(self, u, state, return_state, cu_seqlens):
        if state is not None or return_state or cu_seqlens is not None:
            raise ValueError("sequence_parallel: a block split across ranks takes no state, returns none and "
                             "packs no sequences")
        z = self.linear_in(u)
        halo = conv_halo(z[..., :self.lru_width], self.conv1d.kernel_size, self.sequence_parallel)
        x, y, _ = conv_gelu(z, self.conv1d.weight, self.conv1d.bias, halo, False, self.glue_backend, None)
        x, _ = self.mixer(x, group=self.sequence_parallel)
        return self.linear_out(x * y), None

    def init_state(self, batch: int, device=None, dtype=None) -> BlockState:
        """Zero state for ``batch`` rows: the Conv1D window in ``dtype`` (default: the block's), the mixer
        state fp32 (float64 for a float64 block), on ``device`` (default: the block's)."""
        positive_int("batch", batch)
        weight = self.linear_in.weight
        device = weight.device if device is None else device
        dtype = weight.dtype if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        return BlockState(self.conv1d.empty_state(batch, device, dtype),
                          torch.zeros(batch, self.lru_width, device=device, dtype=state_dtype(dtype)))

    def decode(self, u_t, state: BlockState, residual=None):
        """out_t [B, width] from u_t [B, width], updating ``state`` in place: the decoding loop's step,
        unchecked (one fused kernel between the two projections on CUDA, samu.ops.step). With
        ``residual`` (holding linear_out's bias, RMSNorm.decode), residual + out_t in the out-projection."""
        z = self.linear_in(u_t)
        g = self.mixer.block_step(z, self.conv1d.weight, self.conv1d.bias, state.conv, state.mixer)
        return self.linear_out(g) if residual is None else linear_onto(residual, g, self.linear_out)

    def step(self, u_t, state=None):
        check_token("u_t", u_t, self.width)
        check_weights_dtype("u_t", u_t, self.linear_in.weight)
        state = self.fresh_state(state, u_t.shape[0])
        return self.decode(u_t, state), state

    def fresh_state(self, state, batch: int) -> BlockState:
        """A contiguous copy of ``state`` (checked against ``batch``), or a zero state when it is None:
        what the functional step() decodes into, leaving the caller's state alone."""
        conv_state, mixer_state = self._unpack(state, batch)
        if state is None:
            return self.init_state(batch)
        dtype = self.linear_in.weight.dtype
        return BlockState(conv_state.to(dtype, copy=True).contiguous(),
                          mixer_state.to(state_dtype(dtype), copy=True).contiguous())

    def extra_repr(self):
        return f"width={self.width}, lru_width={self.lru_width}, mixer={self.mixer_name!r}"


def _merge_in_projections(module, state_dict, prefix, *args):
    """Checkpoints written before W_x and W_y became one GEMM: their two projections, as linear_in."""
    x, y = prefix + "linear_x.", prefix + "linear_y."
    if x + "weight" in state_dict and y + "weight" in state_dict:
        for name in ("weight", "bias"):
            state_dict[prefix + "linear_in." + name] = torch.cat([state_dict.pop(x + name),
                                                                   state_dict.pop(y + name)])


class ResidualLayer(nn.Module):
    """x + RecurrentBlock(RMSNorm(x)), then + GatedMLP(RMSNorm(.)): one layer of the language model.

    forward(x [B, L, width], state: BlockState | None, return_state) -> (x [B, L, width], BlockState | None)
    step(x_t [B, width], state: BlockState | None) -> (x_t [B, width], a new BlockState)
    init_state(batch) -> a zero BlockState; decode(x_t, state, one_row=None) -> x_t, updating the state in place
    """

    def __init__(self, width: int, mixer: str = "samu", lru_width: int | None = None,
                 num_heads: int = 16, conv_width: int = 4, mlp_expansion: int = 3,
                 norm_eps: float = 1e-6, *, backend: str = "auto", device=None, dtype=None):
        super().__init__()
        finite_number("norm_eps", norm_eps, positive=True)
        positive_int("mlp_expansion", mlp_expansion)
        kw = dict(device=device, dtype=dtype)
        fused = fused_backend(backend)
        self.temporal_norm = RMSNorm(width, norm_eps, backend=fused, **kw)
        self.block = RecurrentBlock(width, mixer, lru_width, num_heads, conv_width, backend=backend, **kw)
        self.mlp_norm = RMSNorm(width, norm_eps, backend=fused, **kw)
        self.mlp = GatedMLP(width, mlp_expansion, backend=fused, **kw)

    def forward(self, x, state=None, return_state=False, cu_seqlens=None):
        check_sequence("x", x, self.block.width)
        check_weights_dtype("x", x, self.block.linear_in.weight)
        # the norms feed only products: under autocast they write its dtype, and the first sum joins the second
        # norm's pass (x stays in its own dtype: the residual stream)
        dtype = product_dtype(x)
        h, state = self.block(self.temporal_norm(x, dtype), state, return_state, cu_seqlens)
        x, v = self.mlp_norm.add_norm(x, h, dtype)
        return x + self.mlp(v), state

    def init_state(self, batch: int, device=None, dtype=None) -> BlockState:
        return self.block.init_state(batch, device, dtype)

    def decode(self, x_t, state: BlockState, one_row: bool | None = None):
        """x_t [B, width] -> x_t, updating ``state`` in place (unchecked; RecurrentBlock.decode). ``one_row``:
        whether to take the one-row products, as ``takes_one_row(x_t)`` said for this x_t's kind (None: ask it
        now; a decoding loop asks once, LanguageModel.decode_plan)."""
        if one_row is None:
            one_row = self.takes_one_row(x_t)
        if one_row:
            return self._decode_row(x_t, state)
        # each norm also writes x_t + the next product's bias, which adds the residual in its epilogue
        u_t, residual = self.temporal_norm.decode(x_t, self.block.linear_out.bias)
        x_t = self.block.decode(u_t, state, residual)
        v_t, residual = self.mlp_norm.decode(x_t, self.mlp.down.bias)
        return self.mlp.decode(v_t, residual)

    def _products(self):
        block, mlp = self.block, self.mlp
        return (block.linear_in, block.linear_out, mlp.gate_up, mlp.down)

    def takes_one_row(self, x_t) -> bool:
        """Whether a decoding step of x_t runs on samu.ops.rowprod_triton's one-row products: one row, the fused
        kernels' backend for every part, no autocast, every product's weight and bias and both norms' weights in
        x_t's dtype, and on CUDA programmatic dependent launch (where they were timed faster than cuBLAS's
        products; without it, unmeasured)."""
        if x_t.shape[0] != 1 or not x_t.is_contiguous() or autocast_dtype(x_t.device.type) is not None:
            return False
        if not all(fused_kernels(x_t, b) for b in (self.temporal_norm.backend, self.mlp_norm.backend,
                                                   self.mlp.backend)):
            return False
        if x_t.device.type == "cuda":
            from samu.ops.triton_utils import pdl   # Triton is there: fused_kernels said so

            if not pdl(x_t.device):
                return False
        tensors = [self.temporal_norm.weight, self.mlp_norm.weight]
        for linear in self._products():
            tensors += [linear.weight, linear.bias]
        return all(t is not None and t.dtype == x_t.dtype and t.is_contiguous() for t in tensors)

    def _decode_row(self, x_t, state: BlockState):
        """decode() at batch 1 in five launches: the in-projection with the temporal norm in its prologue, the
        block's step, the out-projection onto x_t, gate_up with the MLP's norm, down with the GeGLU gate onto
        the sum (samu.ops.rowprod_triton)."""
        from samu.ops.rowprod_triton import row_product

        linear_in, linear_out, gate_up, down = self._products()
        block = self.block
        z = row_product(x_t, linear_in.weight, linear_in.bias,
                        norm=(self.temporal_norm.weight, self.temporal_norm.eps))
        g = block.mixer.block_step(z, block.conv1d.weight, block.conv1d.bias, state.conv, state.mixer)
        x_t = row_product(g, linear_out.weight, linear_out.bias, residual=x_t)
        h = row_product(x_t, gate_up.weight, gate_up.bias, norm=(self.mlp_norm.weight, self.mlp_norm.eps))
        return row_product(h, down.weight, down.bias, geglu=True, residual=x_t)

    def step(self, x_t, state=None):
        check_token("x_t", x_t, self.block.width)
        check_weights_dtype("x_t", x_t, self.block.linear_in.weight)
        state = self.block.fresh_state(state, x_t.shape[0])
        return self.decode(x_t, state), state
