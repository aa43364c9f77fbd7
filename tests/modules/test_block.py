"""RecurrentBlock and ResidualLayer: spec §9 wiring, step decoding, carried state, counts, bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import samu
from samu.modules import BlockState, RecurrentBlock, ResidualLayer
from samu.modules.layers import product_dtype
from samu.ops import dispatch
from tests.helpers import live_parameters, rel_err

CASES = [dict(mixer="samu", lru_width=10), dict(mixer="rglru", lru_width=12, num_heads=3)]


def _block(seed=0, **kw):
    torch.manual_seed(seed)
    block = RecurrentBlock(9, **kw)
    if kw["mixer"] == "samu":
        with torch.no_grad():
            block.mixer.amplitudes.copy_(torch.tensor([[0.6, -0.2], [0.3, 0.8]]))
    return live_parameters(block, seed)


@pytest.mark.parametrize("kw", CASES)
def test_block_follows_spec_with_the_reference_mixer(kw):
    block = _block(**kw)
    u = torch.randn(2, 13, 9)
    out, _ = block(u)
    E = block.lru_width
    w, b = block.linear_in.weight, block.linear_in.bias
    y = F.gelu(u @ w[E:].t() + b[E:], approximate="tanh")
    x = u @ w[:E].t() + b[:E]
    K = block.conv1d.kernel_size
    xp = F.pad(x, (0, 0, K - 1, 0))
    x = block.conv1d.bias + sum(block.conv1d.weight[i] * xp[:, i:i + 13] for i in range(K))
    m = block.mixer
    if kw["mixer"] == "samu":
        x, _ = samu.reference.samu_mixer(x, m.nu, m.theta_log, m.directions, m.amplitudes)
    else:
        x, _ = samu.reference.rglru_mixer(x, m.w_a, m.b_a, m.w_x, m.b_x, m.a_param)
    expected = (x * y) @ block.linear_out.weight.double().t() + block.linear_out.bias
    assert rel_err(out, expected) < 1e-5


@pytest.mark.parametrize("kw", CASES)
def test_block_step_equals_forward_token_by_token(kw):
    block = _block(1, **kw)
    u = torch.randn(3, 11, 9)
    out, final = block(u, return_state=True)
    state = None
    for t in range(u.shape[1]):
        out_t, state = block.step(u[:, t], state)
        assert rel_err(out_t, out[:, t]) < 1e-5
    assert rel_err(state.conv, final.conv) < 1e-6
    assert rel_err(state.mixer, final.mixer) < 1e-5
    assert state.mixer.dtype == torch.float32


@pytest.mark.parametrize("kw", CASES)
def test_block_carried_state_equals_unsplit(kw):
    block = _block(2, **kw)
    u = torch.randn(2, 17, 9)
    out, final = block(u, return_state=True)
    a, s = block(u[:, :6], return_state=True)
    b, s = block(u[:, 6:], s, return_state=True)
    assert rel_err(torch.cat([a, b], 1), out) < 1e-5
    assert rel_err(s.mixer, final.mixer) < 1e-5 and rel_err(s.conv, final.conv) < 1e-6


@pytest.mark.parametrize("kw", CASES)
def test_residual_layer_step_and_split(kw):
    torch.manual_seed(3)
    layer = live_parameters(ResidualLayer(9, **kw), 3)
    x = torch.randn(2, 10, 9)
    out, final = layer(x, return_state=True)
    state = None
    for t in range(x.shape[1]):
        out_t, state = layer.step(x[:, t], state)
        assert rel_err(out_t, out[:, t]) < 1e-5
    a, s = layer(x[:, :3], return_state=True)
    b, _ = layer(x[:, 3:], s)
    assert rel_err(torch.cat([a, b], 1), out) < 1e-5
    out.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("backend", ["auto", "triton"])
@pytest.mark.parametrize("kw", CASES)
def test_residual_layer_under_autocast_is_its_ops_one_after_another(kw, backend):
    """Under autocast the layer's norms write the products' dtype and its first sum joins the second norm
    (samu.ops.rmsnorm.add_rms_norm): the values of the norm, the block, the sum, the norm and the MLP as
    separate ops, forward and every gradient (the fused kernels through the interpreter on CPU, compiled on
    CUDA, where the sum's cotangent joining inside the kernel may round differently: fp32's rule there)."""
    if backend == "triton":
        if not dispatch.triton_available():
            pytest.skip("triton is not installed")
        # a named variant: gated or not, and the fused norms, glue and GeGLU beside it
        backend = {"samu": "triton_serial", "rglru": "triton_chunked"}[kw["mixer"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(6)
    layer = ResidualLayer(9, **kw, backend=backend, device=device)
    x = torch.randn(2, 10, 9, device=device)

    def apart(x):
        h, _ = layer.block(layer.temporal_norm(x))
        x = x + h
        return x + layer.mlp(layer.mlp_norm(x))

    results = []
    for fn in (lambda x: layer(x)[0], apart):
        xg = x.clone().requires_grad_()
        with torch.autocast(device, dtype=torch.bfloat16):
            assert product_dtype(xg) == torch.bfloat16
            out = fn(xg)
        grads = torch.autograd.grad(out.square().sum(), [xg, *layer.parameters()])
        results.append([out, *grads])
    assert results[0][0].dtype == torch.float32 and torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:], results[1][1:]):
        assert torch.equal(a, b) if device == "cpu" else rel_err(a, b) < 1e-6


def test_product_dtype_is_autocasts_for_fp32_only():
    x = torch.randn(2, 3)
    assert product_dtype(x) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert product_dtype(x) == torch.bfloat16
        assert product_dtype(x.double()) is None and product_dtype(x.half()) is None
        # a device type autocast does not know: no cast to save
        assert product_dtype(torch.empty(2, 3, device="meta")) is None


def test_block_state_is_constant_size():
    block = _block(**CASES[0])
    _, short = block(torch.randn(2, 3, 9), return_state=True)
    _, long = block(torch.randn(2, 40, 9), return_state=True)
    assert [t.shape for t in short] == [t.shape for t in long] == [(2, 3, 10), (2, 10)]


@pytest.mark.parametrize("mixer,heads,mixer_count", [("samu", 16, 3 * 1024 + 4),
                                                      ("rglru", 16, 2 * 1024 * 1024 // 16 + 3 * 1024)])
def test_block_parameter_count(mixer, heads, mixer_count):
    block = RecurrentBlock(1024, mixer, num_heads=heads, device="meta")
    linears = 3 * (1024 * 1024 + 1024)
    conv = 4 * 1024 + 1024
    assert sum(p.numel() for p in block.parameters()) == linears + conv + mixer_count


def test_block_refuses_an_unknown_backend_and_fused_kernels_without_triton_support():
    with pytest.raises(ValueError, match="backend must be one of .*got 'bogus'"):
        RecurrentBlock(8, mixer="samu", backend="bogus")
    from samu.ops.glue import fused_kernels

    with pytest.raises(ValueError, match="glue backend must be one of"):
        fused_kernels(torch.zeros(1), "cuda")
    with pytest.raises(TypeError, match="float64"):
        fused_kernels(torch.zeros(1, dtype=torch.float64), "triton")


def test_block_bad_inputs():
    with pytest.raises(ValueError, match="mixer must be one of"):
        RecurrentBlock(8, "gru")
    with pytest.raises(ValueError, match="num_heads must be a positive integer, got -1"):
        RecurrentBlock(8, "samu", num_heads=-1)
    with pytest.raises(ValueError, match="norm_eps must be a finite number > 0"):
        ResidualLayer(8, norm_eps=0.0)
    with pytest.raises(ValueError, match="mlp_expansion must be a positive integer"):
        ResidualLayer(8, mlp_expansion=0)
    with pytest.raises(ValueError, match="dtype must be a floating-point torch.dtype"):
        RecurrentBlock(8).init_state(2, dtype=torch.long)
    with pytest.raises(ValueError, match="lru_width must be even"):
        RecurrentBlock(8, "samu", lru_width=7)
    with pytest.raises(ValueError, match="num_heads must divide"):
        RecurrentBlock(8, "rglru", num_heads=3)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        RecurrentBlock(8, "rglru", num_heads=0)
    with pytest.raises(ValueError, match="width must be a positive integer"):
        RecurrentBlock(0)
    with pytest.raises(ValueError, match="conv_width must be a positive integer"):
        RecurrentBlock(8, conv_width=0)
    with pytest.raises(TypeError, match="u has dtype torch.bfloat16 but the layer's weights are torch.float32"):
        RecurrentBlock(8)(torch.randn(1, 3, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16 but the layer's weights are torch.float32"):
        ResidualLayer(8)(torch.randn(1, 3, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x_t has dtype torch.bfloat16 but the layer's weights are torch.float32"):
        ResidualLayer(8).step(torch.randn(1, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="u_t has dtype int64"):
        RecurrentBlock(8).step(torch.zeros(1, 8, dtype=torch.long))
    block = RecurrentBlock(8, "rglru", num_heads=4)
    with pytest.raises(ValueError, match=r"u must have shape \[B, L, 8\]"):
        block(torch.randn(2, 3, 6))
    with pytest.raises(TypeError, match="state must be a BlockState"):
        block(torch.randn(2, 3, 8), state=torch.zeros(2, 8))
    with pytest.raises(ValueError, match="state.mixer must have shape"):
        block(torch.randn(2, 3, 8), state=BlockState(torch.zeros(2, 3, 8), torch.zeros(1, 8)))
    with pytest.raises(ValueError, match="state.conv must have shape"):
        block.step(torch.randn(2, 8), state=BlockState(torch.zeros(2, 4, 8), torch.zeros(2, 8)))
    with pytest.raises(ValueError, match=r"u_t must have shape \[B, 8\]"):
        block.step(torch.randn(2, 1, 8))
    with pytest.raises(TypeError, match="state.conv must be a floating-point tensor"):
        block.step(torch.randn(2, 8), state=BlockState(torch.zeros(2, 3, 8, dtype=torch.int64), torch.zeros(2, 8)))
    with pytest.raises(TypeError, match="state.mixer must be a floating-point tensor"):
        block.step(torch.randn(2, 8), state=BlockState(torch.zeros(2, 3, 8), torch.zeros(2, 8, dtype=torch.int64)))
    with pytest.raises(ValueError, match="state.mixer is on meta, the block on cpu"):
        block.step(torch.randn(2, 8), state=BlockState(torch.zeros(2, 3, 8), torch.zeros(2, 8, device="meta")))
    # a state of another float dtype is taken in the block's (the caller's tensors untouched)
    conv = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    _, new = block.step(torch.randn(2, 8), state=BlockState(conv, torch.zeros(2, 8, dtype=torch.float64)))
    assert new.conv.dtype == torch.float32 and new.mixer.dtype == torch.float32 and conv.dtype == torch.bfloat16


@pytest.mark.parametrize("kw", CASES)
def test_block_loads_checkpoints_with_separate_projections(kw):
    block = _block(3, **kw)
    old = dict(block.state_dict())
    E = block.lru_width
    w, b = old.pop("linear_in.weight"), old.pop("linear_in.bias")
    old.update({"linear_x.weight": w[:E], "linear_x.bias": b[:E], "linear_y.weight": w[E:], "linear_y.bias": b[E:]})
    fresh = _block(4, **kw)
    fresh.load_state_dict(old)
    u = torch.randn(2, 7, 9)
    assert torch.equal(fresh(u)[0], block(u)[0])


@pytest.mark.skipif(not samu.dispatch.triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("kw", CASES)
def test_block_with_fused_glue_equals_unfused(kw):
    # a named Triton variant: that mixer kernel and the fused glue (the interpreter on CPU); "torch": PyTorch ops
    device = "cuda" if torch.cuda.is_available() else "cpu"
    variant = sorted(samu.dispatch.variants(kw["mixer"]))[0]
    blocks = {}
    for name, backend in (("torch", "torch"), ("triton", variant)):
        torch.manual_seed(6)
        blocks[name] = live_parameters(RecurrentBlock(9, backend=backend, **kw), 6).to(device)
    assert blocks["triton"].glue_backend == "triton" and blocks["torch"].glue_backend == "torch"
    u = torch.randn(2, 21, 9, device=device)
    state = BlockState(torch.randn(2, 3, kw["lru_width"], device=device), torch.randn(2, kw["lru_width"], device=device))
    results = {}
    for backend, block in blocks.items():
        leaves = [u.clone().requires_grad_(), state.conv.clone().requires_grad_(),
                  state.mixer.clone().requires_grad_()]
        out, new = block(leaves[0], BlockState(*leaves[1:]), return_state=True)
        grads = torch.autograd.grad(out.square().sum() + new.mixer.sum(), leaves + list(block.parameters()))
        results[backend] = (out, new.conv, new.mixer, *grads)
    for i, (a, b) in enumerate(zip(results["triton"], results["torch"])):
        assert rel_err(a, b) < 2e-5, i
