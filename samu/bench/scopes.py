"""Benchmark scopes (spec §8): what one timed call does, for each candidate implementation.

* ``fwd``   mixer forward (under ``torch.no_grad``).
* ``fb``    mixer forward + backward: dense output cotangent, input and all parameter gradients.
* ``packed`` the same forward + backward of a batch-1 row, unpacked and packed with PACKED_DOCUMENTS
            sequences each (cu_seqlens; ``<op>/<impl>@<N>``), side by side: what packing costs.
* ``block`` RMSNorm + one RecurrentBlock, forward + backward (input and parameter gradients).
* ``step``  one optimizer step of one residual layer: forward, backward, AdamW step.
* ``model`` one full-model training step: forward, cross-entropy, backward, AdamW step; beside samu's
            models, the model peers (``peer_models``: an SDPA transformer, flash-linear-attention's HGRN
            and GLA) of the same preset shape.
* ``gen``   generation: L greedy decoding steps of the full model for B sequences, from the state a
            16-token prompt leaves (samu.models.generate's Decoder: a CUDA graph per step on CUDA as
            ``auto``, the same step eagerly as ``eager``; O(1) state per layer).
* ``prefill`` the full model's forward over B prompts of L tokens, with the final state (no grad): the
            prefill of generation.

The gen and prefill scopes run the model cast to the dtype (as a user serving it would, and as CUDA-graph
decoding needs), the other module scopes under autocast.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from samu.bench import peer_models, peers
from samu.bench.shapes import GEN_PROMPT
from samu.gates.inputs import derive_seed, document_offsets, make_inputs
from samu.ops import dispatch
from samu.ops.functional import rglru_mixer, samu_mixer

SCOPES = ("fwd", "fb", "packed", "block", "step", "model", "gen", "prefill")
MIXER_SCOPES = ("fwd", "fb", "packed")
# sequences a packed candidate packs its row into (issue 15's target: within 5% of unpacked at both)
PACKED_DOCUMENTS = (16, 256)
OPS = ("samu", "rglru")
# The comparison builds timed beside the dispatched op: the chunked PyTorch backend and the peers.
PEER_IMPLS = ("torch",) + tuple(peers.PEERS)
# How the block, step and model scopes run a module: eagerly ("auto") or through torch.compile; the block
# scope also times "gemm", its in- and out-projection GEMMs alone (forward + backward), the block's floor.
# The gen scope decodes as generate() does ("auto": CUDA graphs on CUDA) or with eager steps ("eager").
MODULE_IMPLS = ("auto", "compiled", "gemm", "eager")


@dataclass
class Candidate:
    name: str                   # "<op>/<impl>", e.g. "samu/auto", "rglru/fla-chunk_hgrn"
    op: str
    impl: str                   # a samu backend ("auto", "torch", a variant name) or a peer name
    peer: bool
    run: Callable[[], object]   # one execution of the scope
    params: int
    choice: "str | None" = None
    choice_reason: "str | None" = None
    scratch: tuple = (None, None)
    output: "Callable[[], dict] | None" = None   # {"y"} (and "dx" where the scope has a backward), for agreement
    extra: "dict | None" = None


@dataclass
class Skip:
    name: str
    reason: str


def memory_floor(scope: str, shape, dtype: torch.dtype) -> tuple:
    """(formula, bytes) a mixer must move at least (spec §6); (None, None) outside the mixer scopes."""
    B, L, D = shape
    s = torch.empty((), dtype=dtype).element_size()
    if scope == "fwd":
        return f"2*B*L*D*s (fwd reads x, writes y; s={s} bytes)", 2 * B * L * D * s
    if scope in ("fb", "packed"):
        return f"5*B*L*D*s (fwd reads x, writes y; bwd reads x and dy, writes dx; s={s} bytes)", 5 * B * L * D * s
    return None, None


def _mixer(op: str, impl: str, cu_seqlens=None) -> Callable:
    """f(x, *params) -> y for a samu backend or a peer (a samu backend packed with ``cu_seqlens``)."""
    if impl in peers.PEERS:
        return peers.PEERS[impl][1]
    if op == "samu":
        return lambda x, *p: samu_mixer(x, *p, backend=impl, cu_seqlens=cu_seqlens)[0]
    return lambda x, *p: rglru_mixer(x, *p, backend=impl, cu_seqlens=cu_seqlens)[0]


def _choice(op, shape, dtype, device, backend, packed=False):
    c = dispatch.choose(op, *shape, dtype, device, backend, packed=packed)
    scratch = c.variant.scratch(*shape) if c.variant is not None else (None, None)
    return c, tuple(scratch)


def _packings(scope: str, impl: str, shape, seed: int) -> list:
    """(name suffix, offsets) of each run of ``impl``: unpacked, and in the packed scope packed into each
    of PACKED_DOCUMENTS sequences (drawn as the packed gates draw them) where the row holds that many."""
    runs = [("", None)]
    if scope == "packed" and impl not in peers.PEERS and shape[0] == 1:
        runs += [(f"@{n}", document_offsets(shape[1], n, derive_seed(seed, "documents", n)))
                 for n in PACKED_DOCUMENTS if n <= shape[1]]
    return runs


def mixer_candidates(scope: str, op: str, impls: list[str], shape, dtype, device, seed: int):
    """Candidates of a mixer scope on one shared set of inputs: ([Candidate], [Skip])."""
    inputs = make_inputs(op, shape, dtype, device, seed)
    grad = scope in ("fb", "packed")
    x = inputs["x"].requires_grad_(grad)
    params = [p.requires_grad_(grad) for p in inputs["params"].values()]
    dy = inputs["dy"]
    n_params = sum(p.numel() for p in params)
    found, skipped = [], []
    if scope == "packed" and shape[0] != 1:
        return found, [Skip(f"{op}/*", f"the packed scope packs a batch-1 row, not B={shape[0]}")]
    runs = [(impl, suffix, offsets) for impl in impls for suffix, offsets in _packings(scope, impl, shape, seed)]
    for impl, suffix, offsets in runs:
        name = f"{op}/{impl}{suffix}"
        if impl in peers.PEERS:
            reason = peers.unavailable(impl, device, shape)
            if reason:
                skipped.append(Skip(name, reason))
                continue
            choice, scratch = None, (None, None)
        else:
            try:
                choice, scratch = _choice(op, shape, dtype, device, impl, packed=offsets is not None)
            except (ValueError, TypeError) as err:
                skipped.append(Skip(name, str(err)))
                continue
        # the offsets as ints, as a model hands them to its layers (a device tensor would be read every call)
        f = _mixer(op, impl, offsets)

        if grad:
            def run(f=f):
                return torch.autograd.grad(f(x, *params), [x, *params], dy)

            def output(f=f):
                y = f(x, *params)
                return {"y": y.detach(), "dx": torch.autograd.grad(y, [x], dy)[0]}
        else:
            def run(f=f):
                with torch.no_grad():
                    return f(x, *params)

            def output(run=run):
                return {"y": run()}
        found.append(Candidate(name, op, impl, impl in PEER_IMPLS, run, n_params,
                               choice.name if choice else None, choice.reason if choice else None, scratch, output))
    return found, skipped


def _autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class _Scoped(nn.Module):
    """Makes a model-code module return its main output only (they also return recurrent state)."""

    def __init__(self, *modules: nn.Module):
        super().__init__()
        self.parts = nn.ModuleList(modules)

    def forward(self, x):
        *pre, last = self.parts
        for m in pre:
            x = m(x)
        return last(x)[0]


def build_module(scope: str, op: str, width: int, preset: str, device) -> nn.Module:
    """block: RMSNorm + RecurrentBlock; step: one ResidualLayer; model: LanguageModel of ``preset``
    (gen and prefill: the model itself)."""
    from samu.models import LanguageModel, LMConfig
    from samu.modules import RecurrentBlock, ResidualLayer, RMSNorm

    if scope == "block":
        return _Scoped(RMSNorm(width, device=device), RecurrentBlock(width, mixer=op, device=device))
    if scope == "step":
        return _Scoped(ResidualLayer(width, mixer=op, device=device))
    model = LanguageModel(LMConfig.preset(preset, mixer=op), device=device)
    if scope in ("gen", "prefill"):
        return model
    wrapped = _Scoped(model)
    wrapped.config = model.config
    return wrapped


def module_candidate(scope: str, op: str, shape, dtype, device, seed: int, preset: str = "400m",
                     impl: str = "auto"):
    """The candidate of a block, step, model, gen or prefill scope: (Candidate | None, [Skip]).

    op: "samu" or "rglru", or in the model scope a model peer (``peer_models.MODEL_PEERS``).
    impl: "auto" (eager; in the gen scope generate()'s decoding, CUDA graphs on CUDA), "compiled"
    (torch.compile), in the block scope "gemm" (the projections alone), in the gen scope "eager".
    """
    B, L, D = shape
    name = f"{op}/{impl}"
    peer = op in peer_models.MODEL_PEERS
    why = None
    if impl not in MODULE_IMPLS:
        why = (f"the {scope} scope times {', '.join(MODULE_IMPLS[:2])} (gemm in the block scope, eager in the "
               f"gen scope), not {impl!r}")
    elif impl == "gemm" and scope != "block":
        why = "gemm is the block scope's projections alone"
    elif impl == "eager" and scope != "gen":
        why = "eager is the gen scope's decoding without CUDA graphs (auto is eager elsewhere)"
    elif impl == "compiled" and scope in ("gen", "prefill"):
        why = f"the {scope} scope runs the model as generate() does, without torch.compile"
    elif peer and scope != "model":
        why = "model peers run in the model scope only"
    elif peer:
        why = peer_models.unavailable(op, device)
    if why:
        return None, [Skip(name, why)]
    torch.manual_seed(seed)
    if scope in ("model", "gen", "prefill"):
        from samu.models import LMConfig

        config = LMConfig.preset(preset)
        if config.width != D:
            return None, [Skip(name, f"{scope} scope: preset {preset!r} has width {config.width}, not D={D}")]
    device = torch.device(device)
    try:
        if peer:
            module = _Scoped(peer_models.build(op, config.vocab_size, config.width, config.num_layers, device))
            module.config = config
            choice, scratch = None, (None, None)
        else:
            choice, scratch = _choice(op, shape, dtype, device, "auto")
            module = build_module(scope, op, D, preset, device)
    except (ValueError, TypeError) as err:
        return None, [Skip(name, str(err))]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    params = [p for p in module.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    cast = _autocast(device, dtype)
    if scope in ("gen", "prefill"):
        return _inference(scope, name, op, impl, module.to(dtype), B, L, gen, n_params, preset), []
    if impl == "gemm":
        block = module.parts[1]
        params = [block.linear_in.weight, block.linear_in.bias, block.linear_out.weight, block.linear_out.bias]
        n_params = sum(p.numel() for p in params)
        g = torch.randn(B, L, block.lru_width, generator=gen, device=device).to(dtype).requires_grad_()

        def gemms(u):
            return block.linear_in(u), block.linear_out(g)

        forward = gemms
    else:
        forward = torch.compile(module) if impl == "compiled" else module
    if scope in ("block", "step"):
        x = torch.randn(B, L, D, generator=gen, device=device).to(dtype).requires_grad_()
        dy_fp32 = torch.randn(B, L, D, generator=gen, device=device)
        cast_dy: dict = {}

        def dy(like):
            # the cotangent in the output's dtype, made once (on the untimed first call), not per sample
            key = (like.dtype, tuple(like.shape))
            if key not in cast_dy:
                fp32 = dy_fp32 if like.shape == dy_fp32.shape else torch.randn(like.shape, generator=gen,
                                                                                device=device)
                cast_dy[key] = fp32.to(like.dtype)
            return cast_dy[key]
    else:
        vocab = int(module.config.vocab_size)
        tokens = torch.randint(vocab, (B, L + 1), generator=gen, device=device)
    if scope == "block":
        inputs = [x, g] if impl == "gemm" else [x]

        def run():
            with cast:
                ys = forward(x)
            ys = ys if isinstance(ys, tuple) else (ys,)
            return torch.autograd.grad(ys, [*inputs, *params], [dy(y) for y in ys])
    else:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=device.type == "cuda")

        def backward():
            with cast:
                out = forward(x if scope == "step" else tokens[:, :-1])
            if scope == "step":
                out.backward(dy(out))
            else:
                F.cross_entropy(out.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

        def run():
            backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if scope == "step":
                x.grad = None

    extra = {"mode": impl}
    if scope == "model":
        extra.update(preset=preset, tokens_per_call=B * L)
    choice_name = choice.name if choice is not None else None
    reason = choice.reason if choice is not None else None
    if impl == "gemm":
        choice_name, reason, scratch = None, "the block's two projection GEMMs alone", (None, None)
    return Candidate(name, op, impl, peer, run, n_params, choice_name, reason, scratch, None, extra), []


def _inference(scope, name, op, impl, model, B, L, gen, n_params, preset) -> Candidate:
    """gen: L greedy decoding steps for B sequences from the state of a GEN_PROMPT-token prompt, set up
    (and the decoding step captured) untimed; prefill: the forward over B prompts of L tokens."""
    from samu.models.generate import decoder

    model.eval()
    device = model.embed.weight.device
    vocab = int(model.config.vocab_size)
    if scope == "prefill":
        tokens = torch.randint(vocab, (B, L), generator=gen, device=device)

        @torch.no_grad()
        def run():
            return model(tokens, return_state=True)[1][-1].mixer

        return Candidate(name, op, impl, False, run, n_params, None,
                         "the model's forward over the prompts (the mixers' sequence kernels) with its final state",
                         (None, None), None, {"preset": preset, "tokens_per_call": B * L, "mode": impl})
    prompt = torch.randint(vocab, (B, GEN_PROMPT), generator=gen, device=device)
    with torch.no_grad():
        logits, state = model(prompt, return_state=True)
        dec = decoder(model, B, 0.0, None, graph=impl == "auto" and device.type == "cuda")
    last, rows = logits[:, -1], torch.arange(B, device=device)

    @torch.no_grad()
    def run():
        # every call decodes from the prompt's state (the reload, 2 copies a layer, is timed with it) and
        # makes L + 1 tokens: the first from the prompt's logits, then L decoding steps
        dec.load(rows, state)
        return dec.run(model, last, L + 1, None)

    how = "one CUDA graph replay per token" if dec.graph is not None else "eager steps"
    return Candidate(name, op, impl, False, run, n_params, "step",
                     f"generate()'s decoding ({how}): the fused block step, not the sequence kernels",
                     (None, None), None, {"preset": preset, "tokens_per_call": B * L, "mode": impl,
                                          "cuda_graph": dec.graph is not None})
