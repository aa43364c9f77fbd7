"""samu.ops.triton_utils: the jit helpers that change values on the GPU only (the interpreter takes the plain ops),
and the host helper that cuts a pass's scratch from one buffer."""

import pytest
import torch

pytest.importorskip("triton")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_exp_flushed_is_tl_exp_to_the_bit_above_the_subnormals():
    # the SAMU walks' rho = exp(-w): tl.exp's own instruction and factor, so every result from 2^-126 up is
    # tl.exp's bit for bit; below it, zero where tl.exp gives a subnormal
    import triton
    import triton.language as tl

    from samu.ops.triton_utils import exp_flushed

    @triton.jit
    def both(x, flushed, plain, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x + i, mask=i < n)
        tl.store(flushed + i, exp_flushed(v), mask=i < n)
        tl.store(plain + i, tl.exp(v), mask=i < n)

    x = torch.cat([torch.linspace(-110.0, 10.0, 1 << 20, device="cuda"), -torch.rand(1 << 16, device="cuda") * 88,
                   torch.tensor([0.0, -0.0, -1e-30, float("-inf")], device="cuda")])
    flushed, plain = torch.empty_like(x), torch.empty_like(x)
    both[(triton.cdiv(x.numel(), 1024),)](x, flushed, plain, x.numel(), BLOCK=1024)
    normal = plain >= torch.finfo(torch.float32).tiny
    assert normal.sum() > x.numel() * 0.8
    assert torch.equal(flushed[normal], plain[normal])
    assert torch.all(flushed[~normal] == 0.0)


def test_carve_cuts_contiguous_views_from_one_buffer_each_on_a_512_byte_boundary():
    from samu.ops.triton_utils import carve

    made = []

    def empty(n, device, dtype):
        made.append(n)
        return torch.full((n,), float("nan"), device=device, dtype=dtype)

    shapes = [(2, 3, 5), (7,), (1, 129), (4, 1, 2)]
    views = carve(empty, torch.device("cpu"), *shapes)
    assert made == [128 + 128 + 256 + 128]   # one allocation, each view rounded up to 128 fp32 words
    base = views[0].data_ptr()
    for view, shape, at in zip(views, shapes, (0, 128, 256, 512)):
        assert view.shape == shape and view.is_contiguous() and view.dtype == torch.float32
        assert view.data_ptr() - base == 4 * at and (view.data_ptr() - base) % 512 == 0
    # disjoint: writing each view leaves the others as they were
    for i, view in enumerate(views):
        view.fill_(i)
    assert all(bool((view == i).all()) for i, view in enumerate(views))
