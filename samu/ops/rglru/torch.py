"""RG-LRU mixer in PyTorch: gates by autograd, the recurrence by the chunked two-level scan.

Gates and state are fp32 for bf16/fp16/fp32 input (float64 for float64 input).
"""

from __future__ import annotations

import torch

from samu.ops.scan import linear_scan, state_dtype
from samu.reference import rglru_gates


def rglru_mixer_torch(x, w_a, b_a, w_x, b_x, a_param, initial_state=None, c=8.0):
    """Returns (y [B, L, D] in x.dtype, final state [B, D] in fp32 or float64)."""
    with torch.autocast(x.device.type, enabled=False):
        sdt = state_dtype(x.dtype)
        B, L, D = x.shape
        a, b = rglru_gates(x.to(sdt), *(t.to(sdt) for t in (w_a, b_a, w_x, b_x, a_param)), c)
        h0 = (torch.zeros(B, D, dtype=sdt, device=x.device) if initial_state is None
              else initial_state.to(sdt))
        h = linear_scan(a, b, h0)
    # the final state a tensor of its own: not a view that a change to y would change, nor one that holds y's memory
    return h.to(x.dtype), h[:, -1].clone()
