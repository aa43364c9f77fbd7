"""Recurrent generation: prefill with the full forward, then one O(1) step per new token.

A ``Decoder`` holds the buffers of one batch size, allocated once: the model's state (``init_state``),
the current token, a counter, a chunk of uniform draws and a chunk of output tokens. One decoding step
(``model.decode``, which updates the state in place, sampling and bookkeeping) touches only those buffers,
so on CUDA it is captured once in a CUDA graph and each new token is one replay; elsewhere, and under
autocast (whose weight cache a graph cannot hold), the same step runs eagerly. The host returns to the
loop every CHUNK tokens to draw the next chunk's uniforms and collect its tokens.

Sampling takes one uniform draw per row and token, by inverse CDF over the softmax, so a seeded run draws
the same numbers whether the step is graphed or eager: the two decode the same tokens. Logits that are not
finite (a model producing nan or inf) raise an error at the end of the chunk instead of decoding garbage.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections import OrderedDict

import torch

from samu.models.model import LanguageModel
from samu.ops.linear import autocast_dtype
from samu.ops.packing import sequence_offsets
from samu.validate import finite_number, nonneg_int, positive_int

# decoding steps between two host visits of the loop (the uniform draws and the output chunk)
CHUNK = 256
# on the CPU (eager steps, no host synchronisation to save) new tokens go to on_tokens every STREAM steps
STREAM = 8
# decoders (CUDA graphs) kept per model, the most recently used
KEEP = 4

_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, u: torch.Tensor) -> torch.Tensor:
    """One token per row of finite ``logits`` [B, V] from the uniform draws ``u`` [B] in [0, 1): the first
    index whose cumulative probability exceeds u (softmax of logits / temperature, over the top_k
    likeliest when given); temperature 0 picks the most likely token and ignores u. No host
    synchronisation (rows that are not finite give some token: check them apart, as Decoder does)."""
    if temperature == 0:
        return logits.argmax(-1)
    # the row's maximum first, so a small temperature cannot overflow
    logits = logits.float()
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    V = logits.shape[-1]
    if top_k is not None and top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # float64 sums: u * total < total exactly, so the index found has a nonzero probability
    cdf = torch.softmax(logits, dim=-1).double().cumsum(-1)
    target = u.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=V - 1)


class Decoder:
    """The decoding loop of ``batch`` rows for one model, temperature and top_k (see the module docstring).

    load(rows, state) copies a prefill's state into the given rows; run(model, logits, n, generator) ->
    [batch, n] tokens, the first sampled from ``logits`` [batch, V] (the prompt's last), then n - 1 steps.
    """

    @torch.no_grad()
    def __init__(self, model: LanguageModel, batch: int, temperature: float, top_k: int | None, graph: bool):
        self.device = device = model.embed.weight.device
        self.batch, self.temperature, self.top_k = batch, temperature, top_k
        self.state = model.init_state(batch)
        self.plan = model.decode_plan(batch)
        self.token = torch.zeros(batch, dtype=torch.int64, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.bad = torch.zeros(1, dtype=torch.bool, device=device)   # a step saw logits not finite
        self.chunk = CHUNK
        # float64 draws: a token's probability is resolved well below fp32's 2^-24
        self.uniforms = torch.zeros(CHUNK, batch, dtype=torch.float64, device=device)
        self.out = torch.zeros(CHUNK, batch, dtype=torch.int64, device=device)
        self.graph = self._capture(model) if graph else None

    def _sample(self, logits, u):
        self.bad.logical_or_(~torch.isfinite(logits).all())
        return sample(logits, self.temperature, self.top_k, u)

    def _step(self, model):
        token = self._sample(model.decode(self.token, self.state, self.plan),
                             self.uniforms.index_select(0, self.counter)[0])
        self.out.index_copy_(0, self.counter, token[None])
        self.token.copy_(token)
        self.counter.add_(1)

    def _capture(self, model) -> torch.cuda.CUDAGraph:
        # warm-up steps on a side stream of the model's device compile the kernels and set up cuBLAS outside
        # the capture; what they write into the buffers is replaced by load() and run()
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step(model)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._step(model)
        return graph

    @torch.no_grad()
    def load(self, rows: torch.Tensor, state) -> None:
        """Copy ``state`` (model.forward's, one entry per row of ``rows``) into those rows of the buffers."""
        for buf, s in zip(self.state, state):
            buf.conv.index_copy_(0, rows, s.conv.to(buf.conv.dtype))
            buf.mixer.index_copy_(0, rows, s.mixer.to(buf.mixer.dtype))

    @torch.no_grad()
    def run(self, model, logits: torch.Tensor, n: int, generator, on_tokens=None) -> torch.Tensor:
        """[batch, n] tokens: the first sampled from ``logits``, then n - 1 decoding steps; ``on_tokens`` (if
        given) is called with each chunk's [batch, size] tokens as it is done."""
        chunks = []
        self.bad.zero_()
        for start in range(0, n, self.chunk):
            size = min(self.chunk, n - start)
            if self.temperature > 0:
                self.uniforms.uniform_(generator=generator)
            first = 0
            if start == 0:
                token = self._sample(logits, self.uniforms[0])
                self.token.copy_(token)
                self.out[0].copy_(token)
                first = 1
            self.counter.fill_(first)
            shown = 0
            for i in range(first, size):
                if self.graph is not None:
                    with torch.cuda.device(self.device):
                        self.graph.replay()
                else:
                    self._step(model)
                    if on_tokens is not None and self.device.type == "cpu" and i + 1 - shown >= STREAM:
                        self._check()
                        on_tokens(self.out[shown:i + 1].clone().T)
                        shown = i + 1
            chunks.append(self.out[:size].clone())
            self._check()
            if on_tokens is not None and shown < size:
                on_tokens(chunks[-1][shown:].T)
        return torch.cat(chunks).T

    def _check(self):
        if bool(self.bad):
            raise ValueError("the model's logits hold nan or inf while decoding (weights or activations "
                             "overflowed?); nothing was sampled from them")


def _key(model, batch, temperature, top_k, graph):
    """What a decoder's captured graph and its plan (LanguageModel.decode_plan) depend on: the batch, the
    sampling, every tensor's address, shape, strides and dtype (a moved or cast model gets a new decoder), every
    backend choice and every module's settings (eps, radial_bound, c, ...: their extra_repr), and the autocast
    state on the model's device."""
    tensors = tuple((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
                    for t in (*model.parameters(), *model.buffers()))
    settings = tuple((m.extra_repr(), *(getattr(m, name, None) for name in ("backend", "glue_backend")))
                     for m in model.modules())
    autocast = autocast_dtype(model.embed.weight.device.type)
    return batch, float(temperature), top_k, graph, tensors, settings, autocast


def decoder(model: LanguageModel, batch: int, temperature: float, top_k: int | None, graph: bool) -> Decoder:
    """The model's Decoder for these settings, made (and captured) on first use and then kept."""
    kept = _decoders.setdefault(model, OrderedDict())
    key = _key(model, batch, temperature, top_k, graph)
    if key in kept:
        kept.move_to_end(key)
        return kept[key]
    # decoders over other tensors (parameters since replaced, moved or cast) serve no later call: free their memory
    for stale in [k for k in kept if k[4] != key[4]]:
        del kept[stale]
    made = kept[key] = Decoder(model, batch, temperature, top_k, graph)
    while len(kept) > KEEP:
        kept.popitem(last=False)
    return made


def _prompts(prompt, vocab: int, device, cu_seqlens=None) -> tuple[list[torch.Tensor], bool]:
    """(one int64 row per prompt on ``device``, whether the result is a list of rows: ``prompt`` was a list,
    or one packed row with ``cu_seqlens``)."""
    ragged = isinstance(prompt, (list, tuple))
    rows = list(prompt) if ragged else None
    if cu_seqlens is not None:
        if ragged or not isinstance(prompt, torch.Tensor) or prompt.dim() not in (1, 2) or (
                prompt.dim() == 2 and prompt.shape[0] != 1):
            shape = list(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
            raise ValueError(f"prompt must be one packed row, a [T] or [1, T] tensor, with cu_seqlens; got {shape}")
        flat = prompt.reshape(1, -1)
        offsets = sequence_offsets(cu_seqlens, flat)
        prompt, ragged = [flat[0, a:b] for a, b in zip(offsets, offsets[1:])], True
        rows = prompt
    if ragged:
        if not rows or not all(isinstance(r, torch.Tensor) and r.dim() == 1 and r.numel() for r in rows):
            got = ", ".join(sorted({type(r).__name__ if not isinstance(r, torch.Tensor) else
                                    "empty tensor" if r.dim() == 1 and r.numel() == 0 else f"{r.dim()}-D tensor"
                                    for r in rows})) or "nothing"
            raise ValueError(f"prompt must be a non-empty list of non-empty [T_i] tensors of tokens (one per "
                             f"prompt; a single prompt may be a [T] tensor), got a list of {got}")
    elif not isinstance(prompt, torch.Tensor) or prompt.dim() not in (1, 2) or prompt.numel() == 0:
        shape = list(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__
        raise ValueError(f"prompt must be a non-empty [B, T] or [T] tensor of tokens, or a list of [T_i] tensors, "
                         f"got {shape}")
    else:
        rows = list(prompt.unsqueeze(0) if prompt.dim() == 1 else prompt)
    if any(r.is_floating_point() or r.is_complex() or r.dtype == torch.bool for r in rows):
        raise ValueError(f"prompt must hold integer tokens in [0, {vocab})")
    rows = [r.to(device=device, dtype=torch.int64) for r in rows]
    every = torch.cat(rows)
    if every.min() < 0 or every.max() >= vocab:
        raise ValueError(f"prompt must hold integer tokens in [0, {vocab})")
    return rows, ragged


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def generate(model: LanguageModel, prompt, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = None, graph: bool | None = None,
             stats: dict | None = None, cu_seqlens=None, on_tokens=None):
    """Continue ``prompt`` by ``max_new_tokens`` sampled tokens.

    Args:
        model: a LanguageModel (its device is used).
        prompt: [B, T] or [T] integer tokens, T >= 1; or a list of [T_i] tensors, prompts of their own lengths
            (their prefill is one packed forward, samu.ops.packing).
        max_new_tokens: how many tokens to append (>= 0).
        temperature: softmax temperature; 0 picks the most likely token.
        top_k: sample among the k most likely tokens only (None: all).
        seed: seeds the sampling generator for reproducible samples.
        graph: decode through a CUDA graph (None: on CUDA unless autocast is on; True there only).
        stats: a dict to fill with prefill_tokens, prefill_s, decode_tokens and decode_s: the prompts'
            tokens, and the tokens made by decoding steps (the first new token of a row comes from its
            prefill), each with its seconds (timing synchronises the device).
        cu_seqlens: the prompt [T] or [1, T] packs N prompts at these offsets (samu.ops.packing): the same
            as the list of them.
        on_tokens: called with the new tokens [B, n] of every chunk of up to CHUNK decoding steps (on the CPU,
            every STREAM steps) as soon as it is done, in order (streaming, progress); their concatenation is
            what the call appends.

    Returns:
        [B, T + max_new_tokens] (or [T + max_new_tokens] for a 1-D prompt) int64 tokens; for a list (or a
        packed prompt), a list of [T_i + max_new_tokens] tensors.
    """
    if not isinstance(model, LanguageModel):
        kind = type(model).__name__
        if kind == "TransformerLM":
            raise TypeError("model is a TransformerLM (samu compare's reference point), which generate() cannot "
                            "sample: it decodes samu's recurrent LanguageModel from its state, and a transformer "
                            "has none")
        raise TypeError(f"model must be a LanguageModel, got {kind}")
    device = model.embed.weight.device
    rows, ragged = _prompts(prompt, model.config.vocab_size, device, cu_seqlens)
    nonneg_int("max_new_tokens", max_new_tokens)
    finite_number("temperature", temperature)
    if top_k is not None:
        positive_int("top_k", top_k)
    if seed is not None and (nonneg_int("seed", seed) >= 2 ** 64):
        raise ValueError(f"seed must be below 2**64, got {seed}")
    if stats is not None and not isinstance(stats, dict):
        raise TypeError(f"stats must be a dict (to fill) or None, got {type(stats).__name__}")
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens must be callable or None, got {type(on_tokens).__name__}")
    autocast = autocast_dtype(device.type) is not None
    if graph is None:
        graph = device.type == "cuda" and not autocast
    elif graph and (device.type != "cuda" or autocast):
        raise ValueError("graph=True needs a model on CUDA and autocast off (cast the model to the dtype instead)")
    bad = model.nonfinite_parameters()
    if bad:
        raise ValueError(f"the model's weights hold nan or inf ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}); "
                         f"a diverged training run? sample an earlier checkpoint")
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    new = torch.zeros(len(rows), 0, dtype=torch.int64, device=device)
    if stats is not None:
        stats.update(prefill_tokens=0, prefill_s=0.0, decode_tokens=0, decode_s=0.0)
    was_training = model.training
    model.eval()
    try:
        if max_new_tokens:
            dec = decoder(model, len(rows), temperature, top_k, bool(graph))
            start = _synchronize(device) if stats is not None else None
            if len({len(r) for r in rows}) == 1:
                out, state = model(torch.stack(rows), return_state=True)
                logits = out[:, -1]
            else:
                # one packed forward: each prompt from a zero state, the state of each at its last token
                offsets = [0, *itertools.accumulate(map(len, rows))]
                out, state = model(torch.cat(rows)[None], return_state=True, cu_seqlens=offsets)
                logits = out[0, [b - 1 for b in offsets[1:]]]
            dec.load(torch.arange(len(rows), device=device), state)
            prefilled = _synchronize(device) if stats is not None else None
            new = dec.run(model, logits, max_new_tokens, generator, on_tokens)
            if stats is not None:
                stats.update(prefill_tokens=sum(map(len, rows)), prefill_s=prefilled - start,
                             decode_tokens=len(rows) * (max_new_tokens - 1), decode_s=_synchronize(device) - prefilled)
    finally:
        model.train(was_training)
    result = [torch.cat([r, n]) for r, n in zip(rows, new)]
    if ragged:
        return result
    result = torch.stack(result)
    return result[0] if prompt.dim() == 1 else result
