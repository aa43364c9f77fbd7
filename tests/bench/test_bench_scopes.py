import pytest
import torch

from samu.bench.runner import impls_for
from samu.bench.scopes import memory_floor, mixer_candidates, module_candidate


def test_memory_floor_formulas():
    formula, n = memory_floor("fwd", (2, 8, 4), torch.bfloat16)
    assert n == 2 * 2 * 8 * 4 * 2 and formula.startswith("2*B*L*D*s")
    formula, n = memory_floor("fb", (2, 8, 4), torch.float32)
    assert n == 5 * 2 * 8 * 4 * 4 and "dy" in formula
    assert memory_floor("block", (2, 8, 4), torch.float32) == (None, None)


def test_impls_for_adds_peers_after_our_backends():
    assert impls_for("samu", ["auto"], with_peers=False) == ["auto"]
    assert impls_for("samu", ["auto", "torch"], with_peers=True) == ["auto", "torch", "ascan-complex"]
    assert impls_for("rglru", ["auto"], with_peers=True) == ["auto", "torch", "fla-chunk_hgrn", "ascan-scalar"]
    assert impls_for("rglru", ["auto"], with_peers=["ascan-scalar", "ascan-complex"]) == ["auto", "ascan-scalar"]
    assert impls_for("samu", ["auto"], with_peers=[]) == ["auto"]


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_mixer_fb_candidate_returns_input_and_every_parameter_gradient(op):
    found, skipped = mixer_candidates("fb", op, ["auto", "torch", "not-a-backend"], (2, 9, 8), torch.float32,
                                      "cpu", seed=1)
    assert [c.name for c in found] == [f"{op}/auto", f"{op}/torch"]
    assert [s.name for s in skipped] == [f"{op}/not-a-backend"]
    auto = found[0]
    assert auto.choice == "torch" and "cpu" in auto.choice_reason
    grads = auto.run()
    n_params = 4 if op == "samu" else 5
    assert len(grads) == 1 + n_params
    assert grads[0].shape == (2, 9, 8)
    assert sum(g.numel() for g in grads[1:]) == auto.params
    assert all(bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_packed_scope_times_each_implementation_unpacked_and_packed(op, monkeypatch):
    from samu.bench import scopes
    from samu.ops import functional

    monkeypatch.setattr(scopes, "PACKED_DOCUMENTS", (3, 40))   # 40 > L: left out
    calls = []
    packed = functional._packed
    monkeypatch.setattr(functional, "_packed", lambda *a: calls.append(a[-1]) or packed(*a))
    found, skipped = mixer_candidates("packed", op, ["auto", "torch"], (1, 30, 8), torch.float32, "cpu", seed=2)
    assert [c.name for c in found] == [f"{op}/auto", f"{op}/auto@3", f"{op}/torch", f"{op}/torch@3"] and not skipped
    assert memory_floor("packed", (1, 30, 8), torch.float32) == memory_floor("fb", (1, 30, 8), torch.float32)
    for c in found:
        grads = c.run()
        assert len(grads) == 1 + (4 if op == "samu" else 5) and all(bool(torch.isfinite(g).all()) for g in grads)
    # the packed runs pass their offsets as ints, drawn as the packed gates draw them (the first one token)
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0][:2] == [0, 1] and calls[0][-1] == 30
    assert len(calls[0]) == 4
    assert not torch.equal(found[1].run()[0], found[0].run()[0])
    found, skipped = mixer_candidates("packed", op, ["auto"], (2, 30, 8), torch.float32, "cpu", seed=2)
    assert not found and "batch-1 row" in skipped[0].reason


def test_mixer_fwd_candidate_is_gradient_free():
    (c, *_), _ = mixer_candidates("fwd", "samu", ["auto"], (1, 5, 4), torch.float32, "cpu", seed=0)
    y = c.run()
    assert y.shape == (1, 5, 4) and not y.requires_grad


@pytest.mark.parametrize("scope", ["block", "step"])
def test_module_scopes_run_on_cpu(scope):
    c, skipped = module_candidate(scope, "rglru", (1, 6, 16), torch.float32, "cpu", seed=0)
    assert skipped == [] and c.name == "rglru/auto" and c.params > 0
    c.run()
    c.run()


def test_model_scope_needs_the_preset_width():
    c, skipped = module_candidate("model", "samu", (1, 6, 64), torch.float32, "cpu", seed=0, preset="tiny")
    assert c is None and "width 128" in skipped[0].reason
    c, skipped = module_candidate("model", "samu", (1, 6, 128), torch.float32, "cpu", seed=0, preset="tiny")
    assert skipped == [] and c.extra == {"mode": "auto", "preset": "tiny", "tokens_per_call": 6}
    c.run()


def test_block_scope_times_its_gemms_alone():
    c, skipped = module_candidate("block", "samu", (2, 6, 16), torch.float32, "cpu", seed=0, impl="gemm")
    assert skipped == [] and c.name == "samu/gemm" and c.choice is None
    # the in-projection (16 -> 32, bias) and the out-projection (16 -> 16, bias)
    assert c.params == 16 * 32 + 32 + 16 * 16 + 16
    grads = c.run()
    assert [tuple(g.shape) for g in grads] == [(2, 6, 16), (2, 6, 16), (32, 16), (32,), (16, 16), (16,)]
    c, skipped = module_candidate("step", "samu", (2, 6, 16), torch.float32, "cpu", seed=0, impl="gemm")
    assert c is None and "block scope" in skipped[0].reason


def test_model_scope_runs_the_transformer_peer_and_names_what_it_skips():
    from samu.bench.runner import _candidates

    found, skipped = _candidates("model", (1, 6, 128), torch.float32, "cpu", ["auto"], True, 0, "tiny")
    assert [c.name for c in found] == ["samu/auto", "rglru/auto", "sdpa-transformer/auto"]
    assert found[2].peer and found[2].extra["tokens_per_call"] == 6
    for c in found:
        c.run()
    reasons = dict(skipped)
    assert "CUDA" in reasons["fla-hgrn/auto"] and "CUDA" in reasons["fla-gla/auto"]
    found, _ = _candidates("model", (1, 6, 128), torch.float32, "cpu", ["auto"], ["sdpa-transformer"], 0, "tiny")
    assert [c.name for c in found] == ["samu/auto", "rglru/auto", "sdpa-transformer/auto"]
    found, _ = _candidates("model", (1, 6, 128), torch.float32, "cpu", ["auto"], [], 0, "tiny")
    assert [c.name for c in found] == ["samu/auto", "rglru/auto"]


@pytest.mark.parametrize("preset", ["tiny", "small", "400m"])
def test_transformer_peer_has_the_presets_parameters_within_5_percent(preset):
    from samu.bench.peer_models import build
    from samu.models import LMConfig

    c = LMConfig.preset(preset)
    peer = build("sdpa-transformer", c.vocab_size, c.width, c.num_layers, "meta")
    n = sum(p.numel() for p in peer.parameters())
    assert abs(n / c.num_params() - 1) < 0.05


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_gen_scope_decodes_greedily_from_the_prompt_state(op):
    from samu.bench.scopes import _inference
    from samu.models import LanguageModel, LMConfig, generate

    c, skipped = module_candidate("gen", op, (2, 5, 64), torch.float32, "cpu", seed=0, preset="tiny")
    assert c is None and "gen scope" in skipped[0].reason
    for impl in ("auto", "eager"):
        c, skipped = module_candidate("gen", op, (2, 5, 128), torch.float32, "cpu", seed=3, preset="tiny", impl=impl)
        assert skipped == [] and c.choice == "step"
        assert c.extra == {"preset": "tiny", "tokens_per_call": 10, "mode": impl, "cuda_graph": False}
        assert torch.equal(c.run(), c.run())  # every timed call starts from the same prompt state
    c, skipped = module_candidate("gen", op, (2, 5, 128), torch.float32, "cpu", seed=3, preset="tiny", impl="compiled")
    assert c is None and "without torch.compile" in skipped[0].reason
    # the same continuation as generate() at temperature 0 from the 16-token prompt drawn from `gen`
    torch.manual_seed(0)
    model = LanguageModel(LMConfig(width=16, num_layers=2, lru_width=8, num_heads=2, mixer=op))
    c = _inference("gen", "x", op, "auto", model, 2, 5, torch.Generator().manual_seed(9), 0, "t")
    prompt = torch.randint(model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(9))
    assert torch.equal(c.run(), generate(model, prompt, 6, temperature=0.0)[:, 16:])   # L = 5 steps after the first
    # prefill: the forward over B prompts of L tokens, returning the last layer's mixer state
    c = _inference("prefill", "x", op, "auto", model, 2, 7, torch.Generator().manual_seed(4), 0, "t")
    tokens = torch.randint(model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(4))
    assert torch.equal(c.run(), model(tokens, return_state=True)[1][-1].mixer) and c.extra["tokens_per_call"] == 14
