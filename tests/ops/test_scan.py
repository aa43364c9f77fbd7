"""The chunked two-level scan of the torch path against the serial scan of the reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from samu import reference
from samu.ops.scan import chunk_size, from_chunks, linear_scan, scan, to_chunks
from tests.helpers import rel_err


def _coefficients(B, L, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(B, L, n, generator=g, dtype=torch.float64) * 0.99
    b = torch.randn(B, L, n, generator=g, dtype=torch.float64)
    h0 = torch.randn(B, n, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        phase = torch.rand(B, L, n, generator=g, dtype=torch.float64) * 6.0
        a, b = torch.polar(a, phase), torch.complex(b, torch.randn(B, L, n, generator=g, dtype=torch.float64))
        h0 = torch.complex(h0, torch.randn(B, n, generator=g, dtype=torch.float64))
    return a.to(dtype), b.to(dtype), h0.to(dtype)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 3), L=st.integers(1, 300), n=st.integers(1, 4), complex_=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_chunked_scan_equals_serial_scan(B, L, n, complex_, seed):
    a, b, h0 = _coefficients(B, L, n, torch.complex128 if complex_ else torch.float64, seed)
    assert rel_err(torch.view_as_real(linear_scan(a, b, h0)) if complex_ else linear_scan(a, b, h0),
                   torch.view_as_real(reference.linear_scan(a, b, h0)) if complex_
                   else reference.linear_scan(a, b, h0)) < 1e-13


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_chunked_scan_gradcheck(dtype):
    a, b, h0 = (t.requires_grad_() for t in _coefficients(2, 37, 2, dtype, 3))
    assert torch.autograd.gradcheck(linear_scan, (a, b, h0))


def test_reverse_scan_runs_right_to_left():
    a, b, h0 = _coefficients(2, 45, 3, torch.float64, 4)
    K = 8
    a_c, b_c = to_chunks(a, K, 1.0), to_chunks(b, K)
    out = torch.empty_like(b_c)

    def keep(k, h):
        out[:, :, k] = h

    scan(lambda k: (a_c[:, :, k], b_c[:, :, k]), h0, K, keep, reverse=True)
    # h_t = a_t h_{t+1} + b_t from the right; the padded tail (a = 1, b = 0) carries h0 to t = L - 1
    flipped = reference.linear_scan(a.flip(1), b.flip(1), h0).flip(1)
    assert rel_err(from_chunks(out, a.shape[1]), flipped) < 1e-13


def test_chunk_layout_round_trip():
    t = torch.randn(2, 37, 3)
    c = to_chunks(t, 8, value=7.0)
    assert c.shape == (2, 5, 8, 3) and torch.equal(c.reshape(2, 40, 3)[:, 37:], torch.full((2, 3, 3), 7.0))
    assert torch.equal(from_chunks(c, 37), t)
    assert chunk_size(1) == 8 and chunk_size(256) == 16 and chunk_size(10 ** 7) == 256
