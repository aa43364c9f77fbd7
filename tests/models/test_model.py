"""LMConfig presets, LanguageModel decoding and carried state, generate(), checkpoints."""

import dataclasses
import json
import math

import pytest
import torch

from samu.models import (PRESETS, CheckpointError, LanguageModel, LMConfig, generate, load_checkpoint,
                         load_model, save_checkpoint)
from samu.models import checkpoint as ckpt
from tests.helpers import live_parameters, rel_err

SMALL = [LMConfig(vocab_size=19, width=12, num_layers=2, mixer="samu", lru_width=10),
         LMConfig(vocab_size=19, width=12, num_layers=2, mixer="rglru", lru_width=8, num_heads=4)]


def _model(config, seed=0):
    torch.manual_seed(seed)
    return live_parameters(LanguageModel(config), seed)


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_preset_parameter_counts(name, mixer):
    config = LMConfig.preset(name, mixer=mixer)
    model = LanguageModel(config, device="meta")
    assert model.num_params() == config.num_params()
    assert model.embed.weight.numel() == config.vocab_size * config.width


def test_presets_sizes():
    assert PRESETS["400m"].num_layers == 12 and PRESETS["400m"].vocab_size == 256
    assert 380e6 < PRESETS["400m"].num_params() < 420e6
    assert PRESETS["tiny"].num_params() < 2e6
    assert PRESETS["tiny"].num_params() < PRESETS["small"].num_params() < PRESETS["400m"].num_params()


@pytest.mark.parametrize("name", list(PRESETS))
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_an_untrained_model_starts_near_a_uniform_guess(name, mixer):
    config = LMConfig.preset(name, mixer=mixer)
    if name == "400m":
        # Its width, fewer layers (fast on CPU): the final RMSNorm makes the logit spread independent of depth.
        config = dataclasses.replace(config, num_layers=2)
    torch.manual_seed(0)
    model = LanguageModel(config)
    g = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(0, 256, (4, 64), generator=g) for _ in range(2))
    with torch.no_grad():
        logits, _ = model(tokens)
    bits = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).item() / math.log(2)
    # A uniform guess costs 8 bits per byte; the current token must not dominate the prediction.
    assert bits < 8.5
    assert (logits.argmax(-1) == tokens).float().mean() < 0.25


def test_head_is_tied_to_the_embedding():
    model = _model(SMALL[0])
    tokens = torch.randint(0, 19, (2, 5))
    logits, _ = model(tokens)
    h = model.embed(tokens)
    for layer in model.layers:
        h, _ = layer(h)
    assert torch.allclose(logits, model.final_norm(h) @ model.embed.weight.t(), atol=1e-5)
    assert not any(p is not model.embed.weight and p.shape == (19, 12) for p in model.parameters())


@pytest.mark.parametrize("config", SMALL, ids=lambda c: c.mixer)
def test_step_equals_forward_token_by_token(config):
    model = _model(config, 1)
    tokens = torch.randint(0, 19, (3, 13), generator=torch.Generator().manual_seed(1))
    logits, final = model(tokens, return_state=True)
    state = None
    for t in range(tokens.shape[1]):
        logits_t, state = model.step(tokens[:, t], state)
        assert rel_err(logits_t, logits[:, t]) < 1e-5
    for s, f in zip(state, final):
        assert rel_err(s.mixer, f.mixer) < 1e-5 and rel_err(s.conv, f.conv) < 1e-5


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_narrow_integer_tokens_give_the_int64_results(dtype):
    # the token check accepts them; the forward and the step take them as int64 tokens
    model = _model(SMALL[0], 1)
    tokens = torch.randint(0, 19, (2, 7), generator=torch.Generator().manual_seed(3))
    assert torch.equal(model(tokens.to(dtype))[0], model(tokens)[0])
    assert torch.equal(model.step(tokens[:, 0].to(dtype))[0], model.step(tokens[:, 0])[0])


@pytest.mark.parametrize("config", SMALL, ids=lambda c: c.mixer)
def test_carried_state_equals_unsplit(config):
    model = _model(config, 2)
    tokens = torch.randint(0, 19, (2, 21), generator=torch.Generator().manual_seed(2))
    logits, _ = model(tokens)
    a, state = model(tokens[:, :8], return_state=True)
    b, _ = model(tokens[:, 8:], state)
    assert rel_err(torch.cat([a, b], 1), logits) < 1e-5


def test_generate_greedy_equals_argmax_of_the_full_forward():
    model = _model(SMALL[0], 3)
    prompt = torch.tensor([[1, 5, 7], [2, 2, 9]])
    out = generate(model, prompt, 6, temperature=0)
    seq = prompt
    for _ in range(6):
        logits, _ = model(seq)
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    assert torch.equal(generate(model, prompt, 6, top_k=1, seed=0), seq)


def test_generate_sampling_is_seeded():
    model = _model(SMALL[1], 4)
    prompt = torch.tensor([3, 4])
    a = generate(model, prompt, 20, temperature=1.5, seed=7)
    b = generate(model, prompt, 20, temperature=1.5, seed=7)
    c = generate(model, prompt, 20, temperature=1.5, seed=8)
    assert a.shape == (22,) and torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:2], prompt) and int(a.max()) < 19
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_generate_top_k_only_samples_the_k_likeliest():
    model = _model(SMALL[0], 5)
    prompt = torch.tensor([[4, 1]])
    logits, _ = model(prompt)
    allowed = set(torch.topk(logits[0, -1], 3).indices.tolist())
    for seed in range(10):
        assert int(generate(model, prompt, 1, temperature=5.0, top_k=3, seed=seed)[0, -1]) in allowed


def test_generate_bad_inputs():
    model = _model(SMALL[0])
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="prompt must hold integer tokens"):
        generate(model, torch.tensor([0, 19]), 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.tensor([1]), -1)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, torch.tensor([1]), 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        generate(model, torch.tensor([1]), 2, top_k=0)
    with pytest.raises(TypeError, match="model must be a LanguageModel"):
        generate(torch.nn.Linear(2, 2), torch.tensor([1]), 2)
    for seed in (1.5, "abc", -1):
        with pytest.raises(ValueError, match="seed must be a non-negative integer"):
            generate(model, torch.tensor([1]), 2, seed=seed)
    with pytest.raises(ValueError, match="seed must be below 2"):
        generate(model, torch.tensor([1]), 2, seed=2 ** 70)
    with pytest.raises(TypeError, match="stats must be a dict"):
        generate(model, torch.tensor([1]), 2, stats=[])
    with pytest.raises(ValueError, match="got a list of 1-D tensor, empty tensor"):
        generate(model, [torch.tensor([1]), torch.tensor([], dtype=torch.long)], 2)


def test_model_bad_inputs():
    model = _model(SMALL[0])
    with pytest.raises(TypeError, match="sequence_parallel must be a torch.distributed process group or None"):
        LanguageModel(LMConfig.preset("tiny"), sequence_parallel=True)
    with pytest.raises(ValueError, match=r"tokens must have shape \[B, L\]"):
        model(torch.zeros(3, dtype=torch.long))
    for dtype in (torch.float32, torch.uint16):
        with pytest.raises(TypeError, match=f"tokens must be a tensor of int64, int32, int16 or uint8 token ids, "
                                            f"got {dtype}"):
            model(torch.zeros(2, 3, dtype=dtype))
    with pytest.raises(ValueError, match="state must be a list of 2"):
        model(torch.zeros(2, 3, dtype=torch.long), state=[None])
    with pytest.raises(ValueError, match=r"token must have shape \[B\]"):
        model.step(torch.zeros(2, 3, dtype=torch.long))
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"tokens must hold integer tokens in \[0, {vocab}\), got values in "
                                         rf"\[0, {vocab}\]"):
        model(torch.tensor([[0, vocab]]))
    with pytest.raises(ValueError, match=r"token must hold integer tokens in \[0, "):
        model.step(torch.tensor([-1]))
    with pytest.raises(TypeError, match="config must be an LMConfig"):
        LanguageModel({"width": 8})


@pytest.mark.parametrize("kw,match", [
    (dict(mixer="gru"), "mixer must be one of"),
    (dict(width=0), "width must be a positive integer"),
    (dict(num_layers=2.5), "num_layers must be a positive integer"),
    (dict(lru_width=9), "lru_width must be even"),
    (dict(mixer="rglru", lru_width=24, num_heads=5), "num_heads=5 must divide lru_width=24"),
    (dict(norm_eps=0.0), "norm_eps"),
])
def test_config_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        LMConfig(**kw)


def test_config_presets_and_dict_round_trip():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        LMConfig.preset("huge")
    with pytest.raises(ValueError, match=r"unknown preset \['tiny'\]"):
        LMConfig.preset(["tiny"])
    config = LMConfig.preset("tiny", mixer="rglru")
    assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="unknown model config field"):
        LMConfig.from_dict({**config.to_dict(), "depth": 3})


def test_checkpoint_round_trip(tmp_path):
    model = _model(SMALL[1], 6)
    path = tmp_path / "run" / "model.pt"
    save_checkpoint(path, model, {"step": 3})
    loaded = load_model(path)
    assert loaded.config == model.config
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(model(tokens)[0], loaded(tokens)[0])
    assert load_checkpoint(path)["train"] == {"step": 3}
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]


def test_checkpoint_errors(tmp_path):
    model = _model(SMALL[0])
    good = tmp_path / "good.pt"
    save_checkpoint(good, model)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(TypeError, match="path must be a checkpoint file or folder"):
        load_model(None)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_model(truncated)
    garbage = tmp_path / "garbage.pt"
    garbage.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_model(garbage)
    payload = torch.load(good, weights_only=True)
    other = tmp_path / "other.pt"
    torch.save({"weights": payload["model"]}, other)
    with pytest.raises(CheckpointError, match="not a samu language-model checkpoint"):
        load_model(other)
    torch.save({**payload, "version": 99}, other)
    with pytest.raises(CheckpointError, match="version 99"):
        load_model(other)
    wider = json.dumps(dataclasses.replace(model.config, width=16).to_dict())
    torch.save({**payload, "config": wider}, other)
    with pytest.raises(CheckpointError, match="do not match the checkpoint's config"):
        load_model(other)
    torch.save({**payload, "config": "{\"width\": -1}"}, other)
    with pytest.raises(CheckpointError, match="invalid model config"):
        load_model(other)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    save_checkpoint(path, _model(SMALL[0], 0))
    before = path.read_bytes()

    def crash(obj, f):
        open(f, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, _model(SMALL[0], 1))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_step_equals_forward_on_gpu(mixer):
    config = LMConfig(width=64, num_layers=2, mixer=mixer, num_heads=4)
    model = _model(config, 7).cuda()
    tokens = torch.randint(0, 256, (2, 37), device="cuda", generator=torch.Generator("cuda").manual_seed(7))
    with torch.no_grad():
        logits, _ = model(tokens)
        state = None
        for t in range(tokens.shape[1]):
            logits_t, state = model.step(tokens[:, t], state)
            assert rel_err(logits_t, logits[:, t]) < 1e-4
    out = generate(model, tokens[:, :5], 20, seed=0)
    assert out.shape == (2, 25) and out.is_cuda
