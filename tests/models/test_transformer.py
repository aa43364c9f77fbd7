"""TransformerLM (the reference point of samu compare and the bench's sdpa-transformer): its config, its
parameter count, causality, training through samu's trainer with an exact resume, checkpoints."""

import json

import pytest
import torch

from samu.data import text_corpus
from samu.models import (LMConfig, TransformerConfig, TransformerLM, build_model, generate, load_checkpoint,
                         load_model)
from samu.train import TrainConfig, train
from tests.helpers import byte_text
from tests.test_train import _Interrupted, _StopAfter

MODEL = TransformerConfig(width=64, num_layers=2)


def test_config_checks_and_counts_its_parameters():
    for preset in ("tiny", "small", "400m"):
        c = TransformerConfig.like(LMConfig.preset(preset))
        assert abs(c.num_params() / LMConfig.preset(preset).num_params() - 1) < 0.05
        assert c.num_params() == sum(p.numel() for p in build_model(c, device="meta").parameters())
    assert TransformerConfig(width=192).head_dim == 64 and TransformerConfig(width=256).head_dim == 128
    with pytest.raises(ValueError, match="width must be a multiple of 64 for a transformer, got 96"):
        TransformerConfig(width=96)
    with pytest.raises(ValueError, match="num_layers must be"):
        TransformerConfig(num_layers=0)
    with pytest.raises(ValueError, match="expected a recurrent model's config, got a sdpa-transformer one"):
        LMConfig.from_dict(MODEL.to_dict())
    with pytest.raises(TypeError, match="config must be an LMConfig or a TransformerConfig, got dict"):
        build_model({})


def test_is_causal_and_carries_no_state():
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(256, 128, 2))
    tokens = torch.randint(256, (2, 9))
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 256
    a, b = model(tokens)[0], model(changed)[0]
    assert torch.equal(a[:, :5], b[:, :5]) and not torch.equal(a[:, 5:], b[:, 5:])
    with pytest.raises(ValueError, match="carries no recurrent state"):
        model(tokens, return_state=True)
    with pytest.raises(TypeError, match=r"model is a TransformerLM .* which generate\(\) cannot sample"):
        generate(model, tokens[0], 2)


def test_packed_sequences_attend_to_themselves_alone():
    torch.manual_seed(0)
    model = TransformerLM(TransformerConfig(256, 128, 2))
    tokens = torch.randint(256, (1, 17))
    offsets = [0, 5, 6, 17]
    packed = model(tokens, cu_seqlens=torch.tensor(offsets, dtype=torch.int32))[0]
    alone = torch.cat([model(tokens[:, a:b])[0] for a, b in zip(offsets, offsets[1:])], dim=1)
    assert torch.equal(packed, alone)
    # the first sequence sees only itself either way; the later ones differ from the unpacked row
    assert torch.allclose(packed[:, :5], model(tokens)[0][:, :5], atol=1e-6)
    assert not torch.allclose(packed[:, 5:], model(tokens)[0][:, 5:], atol=1e-3)
    with pytest.raises(ValueError, match="cu_seqlens must rise strictly"):
        model(tokens, cu_seqlens=[0, 5, 5, 17])


def _config(tmp_path, name, **kw):
    base = dict(model=MODEL, out_dir=str(tmp_path / name), steps=6, batch_size=3, seq_len=24, warmup_steps=2,
                eval_every=3, eval_batches=2, checkpoint_every=3, lr=1e-2, min_lr=1e-3, progress=False)
    return TrainConfig(**{**base, **kw})


def test_trains_through_samu_train_and_resumes_exactly(tmp_path, capsys):
    data = text_corpus(byte_text(tmp_path))
    whole = train(_config(tmp_path, "whole"), data=data)
    assert isinstance(whole.model, TransformerLM)
    assert whole.log["val"][-1]["val_loss"] < whole.log["val"][0]["val_loss"]
    with pytest.raises(_Interrupted):
        train(_config(tmp_path, "parts"), data=_StopAfter(data, 4))
    resumed = train(_config(tmp_path, "parts"), data=data, resume=True)
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    payload = load_checkpoint(tmp_path / "whole" / "checkpoint.pt")
    assert payload["config"] == MODEL and TrainConfig.from_dict(json.loads(payload["train"]["config"])).model == MODEL
    loaded = load_model(tmp_path / "whole" / "checkpoint.pt")
    assert isinstance(loaded, TransformerLM)
    tokens = torch.randint(0, 256, (1, 10))
    assert torch.equal(loaded(tokens)[0], whole.model.cpu()(tokens)[0])
    # the CLI resumes a transformer run as it is, and refuses model flags for it
    from samu.cli import main

    folder = str(tmp_path / "whole")
    assert main(["train", "--out", folder, "--resume", "--data", str(byte_text(tmp_path)), "--no-progress"]) == 0
    assert main(["train", "--out", folder, "--resume", "--layers", "3", "--no-progress"]) == 1
    assert "--layers: this run folder holds a transformer" in capsys.readouterr().err


def test_activation_checkpointing_recomputes_each_layer_to_the_same_gradients(monkeypatch):
    from samu.models import transformer

    torch.manual_seed(1)
    model = TransformerLM(MODEL)
    tokens = torch.randint(0, 256, (2, 12))
    calls = []
    forward = transformer._AttentionLayer.forward
    monkeypatch.setattr(transformer._AttentionLayer, "forward", lambda self, *a: calls.append(1) or forward(self, *a))
    grads, counts = [], []
    for recompute in (False, True):
        model.activation_checkpointing = recompute
        model.zero_grad()
        calls.clear()
        model(tokens)[0].square().mean().backward()
        counts.append(len(calls))
        grads.append([p.grad.clone() for p in model.parameters()])
    assert counts == [MODEL.num_layers, 2 * MODEL.num_layers]   # each layer once more, in the backward
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))
