"""The RecurrentBlock's glue around its mixer, from its one in-projection z = u W_in + b_in [B, L, 2E]:

    x_c = Conv1D(z_x) (causal, depthwise, width K, with a bias and an optional state of the last K - 1
          inputs), a = GeLU_tanh(z_y), where z_x = z[..., :E] and z_y = z[..., E:].

``conv_gelu`` runs it as one fused Triton kernel forward and one backward on CUDA (``glue_triton``), or
as the PyTorch ops below elsewhere and while torch.compile traces (Inductor fuses those itself).
The fused kernels accumulate in fp32 and round once; the PyTorch ops round after each product in the
input dtype, so the two agree to the input dtype's rounding, the fused one the nearer to exact.

Packed rows (``cu_seqlens``, samu.ops.packing): the Conv1D restarts at every boundary, from that
sequence's row of the state. The fused kernels and the PyTorch ops (``packed_causal_conv``: each tap
masked to the token's own sequence, the state's rows gathered where it reaches back) both take the
offsets on the device, so neither needs the host, and torch.compile traces the PyTorch ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from samu.ops import dispatch
from samu.ops.packing import device_offsets, sequence_index

GLUE_BACKENDS = ("auto", "torch", "triton")
# the widest Conv1D the fused kernels take (one accumulator per tap); wider ones run as PyTorch ops
FUSED_MAX_WIDTH = 4


def fused_backend(mixer_backend: str) -> str:
    """The glue, RMSNorm and step backend (GLUE_BACKENDS) that goes with a mixer backend: PyTorch ops beside
    the "torch" and "reference" mixers, the fused kernels beside "triton" or a Triton variant, and
    "auto" beside "auto"; an unknown mixer backend is a ValueError naming it."""
    if not isinstance(mixer_backend, str):
        raise TypeError(f"backend must be a string, got {type(mixer_backend).__name__}")
    if mixer_backend not in dispatch.BASE_BACKENDS:
        # the variant names only for a name that is not a base backend: "auto" on CPU never imports Triton
        named = set(dispatch.variants("samu")) | set(dispatch.variants("rglru")) if dispatch.triton_available() else set()
        if mixer_backend not in named:
            options = ", ".join(repr(b) for b in (*dispatch.BASE_BACKENDS, *sorted(named)))
            raise ValueError(f"backend must be one of {options}; got {mixer_backend!r}")
    return {"auto": "auto", "torch": "torch", "reference": "torch"}.get(mixer_backend, "triton")


def fused_kernels(x: torch.Tensor, backend: str, traced: bool = False) -> bool:
    """Whether the fused glue, RMSNorm and decoding-step kernels run for ``x`` under ``backend`` (GLUE_BACKENDS):
    "auto" on CUDA for bf16, fp16 and fp32; "triton" wherever Triton can run (CUDA, or the interpreter),
    else a ValueError. While torch.compile traces, only kernels that are custom ops (``traced``) run there:
    Inductor fuses the PyTorch ops of the others itself, as fast as the kernels or faster."""
    if backend not in GLUE_BACKENDS:
        raise ValueError(f"glue backend must be one of {', '.join(GLUE_BACKENDS)}, got {backend!r}")
    if backend == "torch" or (torch.compiler.is_compiling() and not traced):
        return False
    if backend == "auto":
        return x.is_cuda and x.dtype != torch.float64 and dispatch.triton_available()
    if x.dtype == torch.float64:
        raise TypeError("the fused glue, RMSNorm and step kernels take bf16, fp16 or fp32; use the torch backend "
                        "for float64")
    unusable = dispatch.triton_unusable(x.device)
    if unusable:
        raise ValueError(f"the fused glue, RMSNorm and step kernels cannot run: {unusable}")
    return True


def last_inputs(x: torch.Tensor, state, K: int) -> torch.Tensor:
    """The Conv1D state after x [B, L, E]: its last K - 1 inputs, reaching back into ``state`` when L < K - 1."""
    B, L, E = x.shape
    old = x.new_zeros(B, K - 1, E) if state is None else state.to(x.dtype)
    window = torch.cat([old, x[:, max(0, L - (K - 1)):]], dim=1)
    return window[:, window.shape[1] - (K - 1):]


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, state=None, return_state=False):
    """y_t = bias + sum_i weight[i] x_{t-(K-1)+i} in x's dtype (the state holds x_{-K+1..-1}, zeros if None).

    The same sum in the same order for a sequence and for one token, so decoding token by token
    reproduces the sequence bit for bit. Returns (y [B, L, E], the last K - 1 inputs or None).
    """
    B, L, E = x.shape
    K = weight.shape[0]
    if state is None:
        state = x.new_zeros(B, K - 1, E)
    window = torch.cat([state.to(x.dtype), x], dim=1)
    weight, bias = weight.to(x.dtype), bias.to(x.dtype)
    y = bias + window[:, :L] * weight[0]
    for i in range(1, K):
        y = torch.addcmul(y, window[:, i:i + L], weight[i])
    return y, (last_inputs(x, state, K) if return_state else None)


def _taps(seq: torch.Tensor, cu: torch.Tensor, K: int):
    """Per tap i and token t of a packed row: the position t - (K - 1) + i, whether it lies in t's own
    sequence, and the entry of that sequence's state it reads otherwise ([K, L] each, and t's sequence)."""
    L = seq.shape[0]
    t = torch.arange(L, device=seq.device)
    n = seq.long()
    first = cu.long()[n]
    pos = t[None, :] - (K - 1) + torch.arange(K, device=seq.device)[:, None]
    return pos, pos >= first[None, :], (pos - first[None, :] + (K - 1)).clamp(0, max(K - 2, 0)), n


def packed_causal_conv(x, weight, bias, state, seq, cu, return_state=False):
    """causal_conv of a packed row x [1, L, E] (``seq`` [L] and ``cu`` [N + 1] on x's device): each token's
    window reaches back to its own sequence's start, then into its row of ``state`` [N, K - 1, E] (zeros
    when None). The same sum in the same order as causal_conv, by PyTorch ops only (no host reads).
    Returns (y [1, L, E], each sequence's last K - 1 inputs [N, K - 1, E] or None)."""
    K = weight.shape[0]
    state = state if K > 1 else None   # a width-1 convolution has no state
    pos, inside, entry, n = _taps(seq, cu, K)
    weight, bias = weight.to(x.dtype), bias.to(x.dtype)
    xs = x[0]

    def tap(i):
        own = torch.where(inside[i, :, None], xs[pos[i].clamp(min=0)], 0.0)
        if state is None:
            return own
        return torch.where(inside[i, :, None], own, state.to(x.dtype)[n, entry[i]])

    y = bias + tap(0) * weight[0]
    for i in range(1, K):
        y = torch.addcmul(y, tap(i), weight[i])
    return y[None], (packed_last_inputs(x, state, cu, K) if return_state else None)


def packed_last_inputs(x, state, cu, K: int) -> torch.Tensor:
    """last_inputs of each sequence of a packed row x [1, L, E]: [N, K - 1, E], reaching back into its row of
    ``state`` (zeros when None) where the sequence is shorter than K - 1."""
    # sequence n's last K - 1 inputs: positions end - (K - 1) .. end - 1
    last = cu.long()[1:, None] - (K - 1) + torch.arange(K - 1, device=x.device)[None, :]
    own = last >= cu.long()[:-1, None]
    window = x[0][last.clamp(min=0)]
    old = (torch.zeros_like(window) if state is None else
           state.to(x.dtype).gather(1, (last - cu.long()[:-1, None] + (K - 1)).clamp(0, K - 2)[..., None]
                                    .expand(-1, -1, x.shape[-1])))
    return torch.where(own[..., None], window, old)


def conv_gelu_torch(z, weight, bias, state=None, seq=None, cu=None, return_state=False):
    """(x_c, a, the new state or None) by PyTorch ops: the unfused glue, the ground the fused kernels are
    tested against; packed with ``seq`` and ``cu`` (packed_causal_conv)."""
    E = z.shape[-1] // 2
    if seq is None:
        xc, _ = causal_conv(z[..., :E], weight, bias, state)
        new = last_inputs(z[..., :E], state, weight.shape[0]) if return_state else None
    else:
        xc, new = packed_causal_conv(z[..., :E], weight, bias, state, seq, cu, return_state)
    return xc, F.gelu(z[..., E:], approximate="tanh"), new


def _state_grad(dxc: torch.Tensor, weight: torch.Tensor, seq=None, cu=None) -> torch.Tensor:
    """d(state)[j] = sum_{i <= j} weight[i] dx_c[j - i] (the outputs that read the state's entry j);
    packed (``seq``, ``cu``), each sequence's row from its own outputs."""
    if seq is not None:
        K, E = weight.shape
        pos, inside, entry, n = _taps(seq, cu, K)
        d = dxc.new_zeros(cu.shape[0] - 1, max(K - 1, 0), E, dtype=torch.float32)
        for i in range(K - 1):
            # tap i of token t reads entry[i, t] of its sequence's state where it reaches back (dense: the other
            # tokens add exact zeros, and no mask becomes a host synchronisation)
            g = torch.where(inside[i, :, None], 0.0, weight[i].float() * dxc[0].float())
            d.index_put_((n, entry[i]), g, accumulate=True)
        return d
    B, L, E = dxc.shape
    K = weight.shape[0]
    d = dxc.new_zeros(B, K - 1, E, dtype=torch.float32)
    for j in range(K - 1):
        for i in range(j + 1):
            if j - i < L:
                d[:, j] += weight[i].float() * dxc[:, j - i].float()
    return d


class _ConvGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, weight, bias, state, seq, cu):
        from samu.ops.glue_triton import conv_gelu_fwd

        ctx.save_for_backward(z, weight, state, seq, cu)
        return conv_gelu_fwd(z, weight, bias, state, seq, cu)

    @staticmethod
    def backward(ctx, dxc, da):
        from samu.ops.glue_triton import conv_gelu_bwd

        z, weight, state, seq, cu = ctx.saved_tensors
        E = z.shape[-1] // 2
        dxc = z.new_zeros(*z.shape[:-1], E) if dxc is None else dxc.contiguous()
        da = z.new_zeros(*z.shape[:-1], E) if da is None else da.contiguous()
        dz, dw, db = conv_gelu_bwd(dxc, da, z, weight, state, seq, cu)
        dstate = None
        if state is not None and ctx.needs_input_grad[3]:
            dstate = _state_grad(dxc, weight, seq, cu).to(state.dtype)
        return dz, dw.to(weight.dtype), db.to(weight.dtype), dstate, None, None


def uses_triton(z: torch.Tensor, weight: torch.Tensor, backend: str = "auto") -> bool:
    """Whether ``conv_gelu`` runs the fused kernels for ``z`` and a Conv1D ``weight`` under ``backend``
    (``fused_kernels``, and a Conv1D width of at most FUSED_MAX_WIDTH)."""
    return weight.shape[0] <= FUSED_MAX_WIDTH and fused_kernels(z, backend)


def conv_gelu(z, weight, bias, state=None, return_state=False, backend="auto", offsets=None):
    """(x_c [B, L, E], a [B, L, E], the new conv state [B, K-1, E] or None) from z [B, L, 2E], a Conv1D
    weight [K, E] and bias [E] and its state [B, K-1, E] or None; see the module docstring.

    backend: "auto" (fused kernels on CUDA, PyTorch ops elsewhere), "torch" or "triton".
    offsets: checked packed offsets (samu.ops.packing.sequence_offsets: N + 1 ints, or inside a trace
    the tensor; B = 1): the states then have N rows.
    """
    E, K = z.shape[-1] // 2, weight.shape[0]
    seq = cu = None
    if offsets is not None:
        cu = device_offsets(offsets, z.device)
        seq = sequence_index(cu, z.shape[1])
    if not uses_triton(z, weight, backend):
        return conv_gelu_torch(z, weight, bias, state, seq, cu, return_state)
    s = None if state is None else state.to(z.dtype).contiguous()
    xc, a = _ConvGelu.apply(z.contiguous(), weight, bias, s, seq, cu)
    if not return_state:
        return xc, a, None
    if seq is None:
        return xc, a, last_inputs(z[..., :E], state, K)
    return xc, a, packed_last_inputs(z[..., :E], state, cu, K)
