"""Decoding: the Decoder's buffers and step, inverse-CDF sampling, prompts of different lengths, and
CUDA-graph decoding against eager decoding (GPU)."""

import importlib

import pytest
import torch

from samu.models import LanguageModel, LMConfig, generate
from samu.ops import dispatch
from samu.models.generate import decoder, sample
from tests.helpers import live_parameters, rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = [LMConfig(vocab_size=19, width=12, num_layers=2, mixer="samu", lru_width=10),
           LMConfig(vocab_size=19, width=12, num_layers=2, mixer="rglru", lru_width=8, num_heads=4)]


def _model(config, seed=0, device="cpu", backend="auto"):
    torch.manual_seed(seed)
    return live_parameters(LanguageModel(config, backend=backend, device=device), seed)


def _greedy_by_forward(model, prompt, n):
    seq = prompt[None]
    for _ in range(n):
        logits, _ = model(seq)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq[0]


def test_sample_is_the_inverse_cdf():
    logits = torch.tensor([[0.0, float("-inf"), 1.0, 2.0], [5.0, 0.0, 0.0, float("-inf")]])
    probs = torch.softmax(logits, -1).double()
    cdf = probs.cumsum(-1)
    for u in (0.0, 1e-9, 0.2, 0.5, 0.9, 1 - 2 ** -24):
        token = sample(logits, 1.0, None, torch.full((2,), u))
        for row in range(2):
            i = int(token[row])
            below = 0.0 if i == 0 else float(cdf[row, i - 1])
            assert probs[row, i] > 0 and below <= u * float(cdf[row, -1]) < float(cdf[row, i]), (u, row, i)
    # top_k keeps the k likeliest; temperature 0 is the argmax whatever u; a tiny temperature cannot overflow
    assert sample(logits, 1.0, 1, torch.tensor([0.99, 0.99])).tolist() == [3, 0]
    assert torch.equal(sample(logits, 0.0, None, torch.rand(2)), logits.argmax(-1))
    assert torch.equal(sample(logits, 1e-40, None, torch.tensor([0.7, 0.7])), logits.argmax(-1))


def test_logits_that_are_not_finite_raise():
    model = _model(CONFIGS[0], 9)
    dec = decoder(model, 2, 1.0, None, False)
    logits = torch.zeros(2, 19)
    logits[1, 4] = float("nan")
    with pytest.raises(ValueError, match="logits hold nan or inf while decoding"):
        dec.run(model, logits, 3, None)
    assert dec.run(model, torch.zeros(2, 19), 3, None).shape == (2, 3)   # the flag is cleared per run


def test_sample_frequencies_follow_the_softmax():
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0]]).expand(20000, 4)
    token = sample(logits, 1.5, None, torch.rand(20000, generator=torch.Generator().manual_seed(0)))
    freq = torch.bincount(token, minlength=4).double() / 20000
    assert (freq - torch.softmax(logits[0] / 1.5, -1).double()).abs().max() < 0.015


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mixer)
def test_decoding_across_chunks_equals_greedy_by_the_forward(config, monkeypatch):
    monkeypatch.setattr(importlib.import_module("samu.models.generate"), "CHUNK", 4)   # several chunks, the first token in one, a partial last
    model = _model(config, 1)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    assert torch.equal(generate(model, prompt, 11, temperature=0), _greedy_by_forward(model, prompt, 11))


def test_cpu_decoding_streams_every_few_steps(monkeypatch):
    monkeypatch.setattr(importlib.import_module("samu.models.generate"), "STREAM", 2)
    model = _model(CONFIGS[0], 1)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    pieces = []
    tokens = generate(model, prompt, 9, temperature=0.7, seed=3, on_tokens=pieces.append)
    assert [p.shape[1] for p in pieces] == [2, 2, 2, 2, 1]
    assert torch.equal(torch.cat(pieces, 1)[0], tokens[5:])
    assert torch.equal(tokens, generate(model, prompt, 9, temperature=0.7, seed=3))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mixer)
def test_prompts_of_different_lengths_decode_as_if_alone(config):
    model = _model(config, 2)
    prompts = [torch.tensor([7]), torch.tensor([1, 2, 3, 4, 5, 6]), torch.tensor([9, 9, 2]),
               torch.tensor([1, 2, 3, 4, 5, 6]).flip(0)]
    out = generate(model, prompts, 8, temperature=0)
    assert isinstance(out, list) and [len(o) for o in out] == [len(p) + 8 for p in prompts]
    for o, p in zip(out, prompts):
        assert torch.equal(o, _greedy_by_forward(model, p, 8))
    # a seeded sample is reproducible for the same batch
    a = generate(model, prompts, 8, temperature=1.0, top_k=5, seed=3)
    b = generate(model, prompts, 8, temperature=1.0, top_k=5, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # the same prompts packed in one row
    offsets = torch.tensor([0, 1, 7, 10, 16], dtype=torch.int32)
    for packed in (torch.cat(prompts), torch.cat(prompts)[None]):
        c = generate(model, packed, 8, temperature=1.0, top_k=5, seed=3, cu_seqlens=offsets)
        assert isinstance(c, list) and all(torch.equal(x, y) for x, y in zip(a, c))
    with pytest.raises(ValueError, match=r"prompt must be one packed row, a \[T\] or \[1, T\] tensor"):
        generate(model, torch.cat(prompts).view(2, 8), 2, cu_seqlens=offsets)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly from 0 to L = 16"):
        generate(model, torch.cat(prompts), 2, cu_seqlens=[0, 3, 15])


def test_init_state_decode_in_place_and_step_leaves_the_state_alone():
    model = _model(CONFIGS[0], 3)
    state = model.init_state(2)
    assert [tuple(s.conv.shape) for s in state] == [(2, 3, 10)] * 2 and state[0].mixer.dtype == torch.float32
    tensors = [t for s in state for t in s]
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    full, _ = model(tokens)
    with torch.no_grad():
        for t in range(3):
            assert rel_err(model.decode(tokens[:, t], state), full[:, t]) < 1e-5
    assert all(a is b for a, b in zip(tensors, [t for s in state for t in s]))
    before = [t.clone() for t in tensors]
    _, new = model.step(tokens[:, 0], state)
    assert all(torch.equal(a, b) for a, b in zip(before, tensors))
    assert all(a is not b for a, b in zip(tensors, [t for s in new for t in s]))


def test_decoders_are_kept_per_setting():
    from samu.models.generate import KEEP

    model = _model(CONFIGS[0], 4)
    a = decoder(model, 2, 0.0, None, False)
    assert decoder(model, 2, 0.0, None, False) is a
    assert decoder(model, 3, 0.0, None, False) is not a and decoder(model, 2, 1.0, None, False) is not a
    # a setting baked into the step (a module's scalar, a backend) makes a new decoder
    model.layers[0].block.mixer.radial_bound = 3.0
    b = decoder(model, 2, 0.0, None, False)
    assert b is not a
    model.layers[0].block.mixer.backend = "torch"
    assert decoder(model, 2, 0.0, None, False) is not b
    for batch in range(1, KEEP + 2):   # only the KEEP most recent are kept
        decoder(model, 10 + batch, 0.0, None, False)
    assert decoder(model, 2, 0.0, None, False) is not b
    model.double()   # the cast tensors (all but the mixers' fp32 parameters) moved: a new decoder
    assert decoder(model, 2, 0.0, None, False) is not a


def test_stats_and_bad_inputs():
    model = _model(CONFIGS[0], 5)
    stats = {}
    generate(model, torch.tensor([[1, 2], [3, 4]]), 5, stats=stats)
    # 5 new tokens a row: the first from the prefill's logits, 4 by decoding steps
    assert stats["prefill_tokens"] == 4 and stats["decode_tokens"] == 8
    assert stats["prefill_s"] >= 0 and stats["decode_s"] >= 0
    generate(model, torch.tensor([[1, 2]]), 0, stats=stats)
    assert stats["decode_tokens"] == 0 and stats["prefill_tokens"] == 0
    with pytest.raises(ValueError, match="prompt must be a non-empty list"):
        generate(model, [torch.tensor([1]), torch.tensor([], dtype=torch.long)], 2)
    with pytest.raises(ValueError, match="got a list of int"):
        generate(model, [1, 2, 3], 2)
    with pytest.raises(ValueError, match=r"tokens in \[0, 19\)"):
        generate(model, [torch.tensor([1]), torch.tensor([19])], 2)
    with pytest.raises(ValueError, match="graph=True needs a model on CUDA"):
        generate(model, torch.tensor([1]), 2, graph=True)


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mixer)
def test_decoding_through_the_fused_kernels_follows_the_forward(config, monkeypatch):
    # a Triton backend everywhere (the interpreter on CPU): the block step, GeGLU and RMSNorm kernels, counted
    from samu.ops import geglu_triton, rmsnorm_triton, step_triton

    calls = []
    for module, name in ((step_triton, "samu_step"), (step_triton, "rglru_step"), (geglu_triton, "geglu_fwd"),
                         (rmsnorm_triton, "rmsnorm_fwd")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _k=kernel, _n=name, **kw: calls.append(_n) or _k(*a, **kw))
    model = _model(config, 7, DEVICE, backend=sorted(dispatch.variants(config.mixer))[0])
    tokens = torch.randint(0, 19, (2, 9), device=DEVICE)
    with torch.no_grad():
        logits, _ = model(tokens)
        calls.clear()
        state = model.init_state(2)
        for t in range(9):
            assert rel_err(model.decode(tokens[:, t], state), logits[:, t]) < 1e-5, t
    step = f"{config.mixer}_step"
    assert [n for n in calls if n in (step, "geglu_fwd")] == [step, "geglu_fwd"] * 9 * config.num_layers
    assert calls.count("rmsnorm_fwd") == 9 * (2 * config.num_layers + 1)
    out = generate(model, tokens[0, :3], 6, temperature=0)
    assert torch.equal(out[:3], tokens[0, :3]) and len(out) == 9


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mixer)
def test_batch_one_decoding_through_the_one_row_products_follows_the_forward(config, monkeypatch):
    # at batch 1 a layer's step is four one-row products around the block's step kernel (the interpreter on CPU)
    from samu.ops import rowprod_triton

    calls = []
    kernel = rowprod_triton.row_product
    monkeypatch.setattr(rowprod_triton, "row_product", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    model = _model(config, 8, DEVICE, backend=sorted(dispatch.variants(config.mixer))[0])
    tokens = torch.randint(0, 19, (1, 7), device=DEVICE)
    with torch.no_grad():
        logits, _ = model(tokens)
        state = model.init_state(1)
        for t in range(7):
            assert rel_err(model.decode(tokens[:, t], state), logits[:, t]) < 1e-5, t
        assert len(calls) == 4 * config.num_layers * 7
        # the functional step leaves the caller's row alone
        layer, x_t = model.layers[0], torch.randn(1, config.width, device=DEVICE)
        kept = x_t.clone()
        layer.step(x_t)
        assert torch.equal(x_t, kept)
        # at batch 2 the layers keep the products of the forward (cuBLAS on CUDA)
        calls.clear()
        model.decode(tokens[:, 0].repeat(2), model.init_state(2))
        assert not calls


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_a_decoder_decides_the_one_row_path_once(monkeypatch):
    # the one-row decision is made once per decoding loop, not per layer and token: each layer is asked once,
    # when the decoder is made, and a kept decoder is not asked again; the autocast state is part of its key
    from samu.modules.block import ResidualLayer

    asked = []
    takes = ResidualLayer.takes_one_row
    monkeypatch.setattr(ResidualLayer, "takes_one_row",
                        lambda self, x_t: asked.append(x_t.shape) or takes(self, x_t))
    config = CONFIGS[0]
    model = _model(config, 3, DEVICE, backend=sorted(dispatch.variants(config.mixer))[0])
    prompt = torch.tensor([3, 1, 4])
    generate(model, prompt, 4, temperature=0, graph=False)
    assert asked == [(1, config.width)] * config.num_layers
    assert decoder(model, 1, 0.0, None, False).plan == [True] * config.num_layers
    asked.clear()
    generate(model, prompt, 4, temperature=0, graph=False)
    assert not asked
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        assert decoder(model, 1, 0.0, None, False).plan == [False] * config.num_layers
    assert len(asked) == config.num_layers
    assert decoder(model, 2, 0.0, None, False).plan == [False] * config.num_layers   # one row only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.mixer)
@pytest.mark.parametrize("rows", ["one", "several"])
def test_graphed_decoding_equals_eager_decoding_bit_for_bit(config, dtype, rows):
    # one prompt: batch 1, the one-row products (with programmatic dependent launch on sm_90); several prompts of
    # their own lengths
    model = _model(config, 6, device="cuda").to(dtype)
    prompts = (torch.tensor([5, 1, 2]) if rows == "one"
               else [torch.tensor([5, 1, 2]), torch.tensor([7]), torch.tensor([3, 3, 3, 3, 3, 3])])
    for temperature, top_k in ((0.0, None), (0.9, 5)):
        kw = dict(temperature=temperature, top_k=top_k, seed=11)
        graphed = generate(model, prompts, 300, graph=True, **kw)   # across a CHUNK boundary
        eager = generate(model, prompts, 300, graph=False, **kw)
        if rows == "one":
            graphed, eager = [graphed], [eager]
        assert all(torch.equal(g, e) for g, e in zip(graphed, eager))
        assert all(o.is_cuda for o in graphed)
    # the graph follows weights updated in place
    with torch.no_grad():
        model.embed.weight.mul_(1.5)
    kw = dict(temperature=0.0)
    assert all(torch.equal(g, e) for g, e in zip(generate(model, prompts, 20, graph=True, **kw),
                                                 generate(model, prompts, 20, graph=False, **kw)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_bf16_batch_one_decoding_follows_the_forward_on_gpu(mixer):
    # bf16 decoding (token by token through the one-row products) rounds the same quantities to bf16 as the bf16
    # forward does, in another order: its error against the fp32 forward of the same weights may be of the same size
    # as the bf16 forward's, not larger (3x allows for the other order)
    config = LMConfig(vocab_size=256, width=256, num_layers=2, mixer=mixer, num_heads=4)
    model = _model(config, 9, device="cuda")
    tokens = torch.randint(0, config.vocab_size, (1, 40), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(9))
    with torch.no_grad():
        exact, _ = model(tokens)
        model = model.to(torch.bfloat16)
        forward, _ = model(tokens)
        plan = model.decode_plan(1)
        assert plan == [True] * config.num_layers   # the one-row products
        state = model.init_state(1)
        decoded = torch.stack([model.decode(tokens[:, t], state, plan) for t in range(tokens.shape[1])], 1)
    decoding, forward = rel_err(decoded.float(), exact), rel_err(forward.float(), exact)
    assert decoding <= 3 * forward + 1e-3, (decoding, forward)
