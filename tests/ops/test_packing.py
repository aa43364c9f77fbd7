"""Packed sequences (cu_seqlens, samu.ops.packing): a packed call equals one call per sequence, for both
mixers in every backend (the Triton variants in the interpreter on CPU), for the block (whose Conv1D
restarts at each boundary) and for the model. For the mixers, outputs, final states and every gradient: bit
for bit against the same backend's calls per sequence where a packed call runs each sequence through the
same dispatch as an unpacked call (torch, reference); for the Triton variants that pack (one call: its chunks
and sums span the boundaries) within 1e-5 of float64 reference calls per sequence (their fp32 calls per
sequence pass the gates in test_*_triton.py); for the block and the model within fp32 rounding (their GEMMs
over all rows may round unlike GEMMs over a piece). Bad offsets fail with one line."""

import pytest
import torch

from samu import rglru_mixer, samu_mixer
from samu.models import LanguageModel, LMConfig
from samu.modules import RecurrentBlock
from samu.ops import dispatch
from tests.helpers import randn, rel_err, rglru_params, samu_params

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

if dispatch.triton_available():
    import triton
    import triton.language as tl

    from samu.ops.packing_triton import step_opens

    @triton.jit
    def _step_opens_kernel(words, out, NC, WC: tl.constexpr):
        """out[s] = step_opens of step s (WC chunks a step)."""
        i_s = tl.program_id(0)
        tl.store(out + i_s, step_opens(words, i_s * WC, NC, WC).to(tl.int32))

# a sequence opening at a chunk's last token and one token long there (token 31: bit 31 of SAMU's 32-token
# chunk, the last of RG-LRU's 16), lengths 1, one chunk exactly (32), a chunk and a bit, a few tokens (the gates
# pack random lengths at the gate shapes: samu gate --documents)
LENGTHS = (31, 1, 5, 1, 37, 32, 2, 10)


def _backends(op):
    return ["torch", "reference"] + (sorted(dispatch.variants(op)) if dispatch.triton_available() else [])


def _mixer(op):
    return (samu_mixer, samu_params) if op == "samu" else (rglru_mixer, lambda D, s, **kw: rglru_params(D, 4, s, **kw))


def _grads(outputs, leaves, seed):
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g).to(o) for o in outputs]
    return torch.autograd.grad(outputs, leaves, cot)


def _separate(fn, x, h0, params, offsets, backend, seed):
    """Outputs, final states and every gradient of one call per sequence, concatenated."""
    ys, hs = [], []
    for n, (a, b) in enumerate(zip(offsets.tolist(), offsets[1:].tolist())):
        y_n, h_n = fn(x[:, a:b], *params, initial_state=h0[n:n + 1], output_final_state=True, backend=backend)
        ys.append(y_n)
        hs.append(h_n)
    y, h = torch.cat(ys, 1), torch.cat(hs)
    return [y, h, *_grads([y, h], [x, h0, *params], seed)]


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_a_packed_mixer_call_equals_one_call_per_sequence(op):
    fn, params_of = _mixer(op)
    D = 16
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    # the kernels' packed calls are judged against float64 calls per sequence (their fp32 calls per sequence
    # pass the gates apart: test_*_triton.py); the PyTorch backends' packed calls are theirs, bit for bit
    leaves64 = [t.detach().double().requires_grad_() for t in (randn((1, offsets[-1].item(), D), 1),
                                                               torch.randn(len(LENGTHS), D),
                                                               *params_of(D, 3))]
    exact64 = _separate(fn, leaves64[0], leaves64[1], leaves64[2:], offsets, "reference", 0)
    for backend in _backends(op):
        params = params_of(D, 3, device=DEVICE)
        x = randn((1, offsets[-1].item(), D), 1, device=DEVICE).requires_grad_()
        h0 = leaves64[1].detach().float().to(DEVICE).requires_grad_()
        y, h = fn(x, *params, initial_state=h0, output_final_state=True, backend=backend,
                  cu_seqlens=offsets.to(DEVICE))
        assert y.shape == x.shape and h.shape == (len(LENGTHS), D)
        packed = [y, h, *_grads([y, h], [x, h0, *params], 0)]
        native = backend in dispatch.variants(op) and dispatch.variants(op)[backend].packs
        if native:
            for i, (p, s) in enumerate(zip(packed, exact64)):
                assert rel_err(p, s.to(p.device)) < 1e-5, (backend, i, rel_err(p, s.to(p.device)))
        else:
            for i, (p, s) in enumerate(zip(packed, _separate(fn, x, h0, params, offsets, backend, 0))):
                assert torch.equal(p, s), (backend, i)
        # no state crosses a boundary: changing the 37-token sequence's input leaves every other output alone
        k = LENGTHS.index(37)
        a, b = offsets[k].item(), offsets[k + 1].item()
        x2 = x.detach().clone()
        x2[:, a:b] += 1.0
        y2, h2 = fn(x2, *params, initial_state=h0, output_final_state=True, backend=backend,
                    cu_seqlens=offsets.tolist())
        outside = torch.ones(x.shape[1], dtype=torch.bool)
        outside[a:b] = False
        others = [n for n in range(len(LENGTHS)) if n != k]
        assert torch.equal(y2[:, outside], y[:, outside]) and not torch.equal(y2[:, a:b], y[:, a:b])
        assert torch.equal(h2[others], h[others])


def test_bad_offsets_name_the_argument():
    params = samu_params(8, 0)
    x = torch.randn(1, 10, 8)
    cases = [(torch.tensor([0, 4, 10]).float(), "cu_seqlens must be an int32 or int64 tensor"),
             (torch.tensor([0], dtype=torch.int32), "cu_seqlens must be an int32 or int64 tensor"),
             (torch.tensor([[0, 10]], dtype=torch.int32), r"tensor \[N \+ 1\] of offsets .* shape \[1, 2\]"),
             (torch.tensor([0, 4, 9], dtype=torch.int32), r"must rise strictly from 0 to L = 10"),
             (torch.tensor([0, 4, 4, 10], dtype=torch.int32), r"every sequence at least one token"),
             ([0.0, 10.0], r"cu_seqlens must be a tensor or a list of N \+ 1 >= 2 int offsets, got list"),
             ("0,10", r"cu_seqlens must be a tensor or a list of N \+ 1 >= 2 int offsets, got str")]
    for fn, p in ((samu_mixer, params), (rglru_mixer, rglru_params(8, 2, 0))):
        for cu, match in cases:
            with pytest.raises((ValueError, TypeError), match=match):
                fn(x, *p, cu_seqlens=cu)
    # int64 offsets, one sequence, a list of ints: all the same call
    one = samu_mixer(x, *params)[0]
    for cu in (torch.tensor([0, 10]), [0, 10], torch.tensor([0, 10], dtype=torch.int32)):
        assert torch.equal(samu_mixer(x, *params, cu_seqlens=cu)[0], one)
    with pytest.raises(TypeError, match="initial_state has dtype int64"):
        samu_mixer(x, *params, initial_state=torch.zeros(2, 8, dtype=torch.long), cu_seqlens=[0, 4, 10])
    with pytest.raises(ValueError, match="packs sequences along L of a batch-1 input; got a batch of 2"):
        samu_mixer(torch.randn(2, 10, 8), *params, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 8\], got \[1, 8\]"):
        samu_mixer(x, *params, initial_state=torch.zeros(1, 8), cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))


# the block's backends: auto, and a packing Triton variant with the fused glue (the interpreter on CPU)
BLOCK_BACKENDS = ["auto"] + (["variant"] if dispatch.triton_available() else [])
VARIANT = {"samu": "triton_grouped", "rglru": "triton_chunked"}


@pytest.mark.parametrize("backend", BLOCK_BACKENDS)
@pytest.mark.parametrize("mixer", ["samu", "rglru"])
def test_a_packed_block_and_model_equal_one_call_per_sequence(mixer, backend):
    torch.manual_seed(0)
    cu = torch.tensor([0, 3, 4, 11], dtype=torch.int32)
    backend = VARIANT[mixer] if backend == "variant" else backend
    block = RecurrentBlock(16, mixer=mixer, num_heads=4, backend=backend, device=DEVICE)
    u = torch.randn(1, 11, 16, device=DEVICE, requires_grad=True)
    out, state = block(u, return_state=True, cu_seqlens=cu)
    assert state.conv.shape == (3, 3, 16) and state.mixer.shape == (3, 16)
    pieces = [block(u[:, a:b], return_state=True) for a, b in zip(cu.tolist(), cu[1:].tolist())]
    assert torch.allclose(out, torch.cat([p[0] for p in pieces], 1), atol=1e-6, rtol=0)
    # every gradient, the Conv1D's and the mixer's included
    leaves = [u, *block.parameters()]
    packed = _grads([out], leaves, 1)
    separate = _grads([torch.cat([p[0] for p in pieces], 1)], leaves, 1)
    for name, a, b in zip(["u", *(n for n, _ in block.named_parameters())], packed, separate):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), name
    # (within fp32 rounding here: the in-projection's GEMM over all rows may round unlike one over a piece's)
    assert torch.allclose(state.conv, torch.cat([p[1].conv for p in pieces]), atol=1e-6, rtol=0)
    assert torch.allclose(state.mixer, torch.cat([p[1].mixer for p in pieces]), atol=1e-6, rtol=0)
    # continuing from the packed state: each sequence from its own row
    more, _ = block(u[:, :4].detach(), state, cu_seqlens=torch.tensor([0, 1, 2, 4], dtype=torch.int32))
    alone, _ = block(u[:, 2:4].detach(), type(state)(state.conv[2:], state.mixer[2:]))
    assert torch.allclose(more[:, 2:4], alone, atol=1e-6, rtol=0)
    model = LanguageModel(LMConfig(vocab_size=19, width=16, num_layers=2, mixer=mixer, num_heads=4), backend=backend,
                          device=DEVICE)
    tokens = torch.randint(0, 19, (1, 11), device=DEVICE)
    logits, states = model(tokens, return_state=True, cu_seqlens=cu)
    separate = torch.cat([model(tokens[:, a:b])[0] for a, b in zip(cu.tolist(), cu[1:].tolist())], 1)
    assert torch.allclose(logits, separate, atol=1e-5, rtol=0) and states[0].mixer.shape == (3, 16)
    model.activation_checkpointing = True
    recomputed, _ = model(tokens, cu_seqlens=cu)
    assert torch.allclose(recomputed, logits, atol=1e-6, rtol=0)
    # inside a trace: an int32 tensor on the input's device passes unread, ints or other tensors are refused
    # in one line, and so is a call that would run one call per sequence
    from samu.ops import packing

    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        on_device = cu.to(DEVICE)
        assert packing.sequence_offsets(on_device, tokens) is on_device
        with pytest.raises(ValueError, match="cu_seqlens: a packed call reads its offsets on the host"):
            packing.sequence_offsets(cu.tolist(), tokens)
        with pytest.raises(ValueError, match="must be an int32 tensor"):
            packing.sequence_offsets(cu.long().to(DEVICE), tokens)
        with pytest.raises(ValueError, match="needs a kernel that packs"):
            packing.per_sequence(lambda *a: None, tokens, on_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_gpu_packed_variants_pass_the_gate_per_sequence(op, dtype):
    """Every Triton variant's one packed call at a realistic shape (16 sequences of random lengths, the
    first one token long) against the float64 reference run one sequence at a time."""
    from samu.gates.inputs import document_offsets
    from tests.helpers import assert_gate, gate_check

    fn, _ = _mixer(op)
    offsets = document_offsets(5000, 16, seed=1)
    for name in dispatch.variants(op):
        def mixer(*args, name=name, **kw):
            return fn(*args, backend=name, **kw)

        # with states and their cotangents, and as training runs (neither)
        for state in (True, False):
            assert_gate(gate_check(op, mixer, dtype, 1, 5000, 1024, H=16, seed=3, device="cuda", cu_seqlens=offsets,
                                   with_state=state, final_grad=state))


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("K", [4, 16, 32])
def test_chunk_boundaries_give_each_chunks_openings_and_sequences(K):
    """The kernels' per-chunk words (bits of the opening tokens, the sequence of the first and the last
    token) against the per-token sequence index, with lengths 1, chunk-sized runs, a last chunk cut short,
    a sequence opening at bit 31 and one sequence alone."""
    from samu.ops.packing import sequence_index
    from samu.ops.packing_triton import chunk_boundaries

    cases = [[0, 1, 2, 3, 35, 36, 68, 100, 101, 131], [0, 131], [0, 31, 32, 63, 64, 95, 96], [0, 1, 64]]
    for offsets in cases:
        L = offsets[-1]
        cu = torch.tensor(offsets, dtype=torch.int32, device=DEVICE)
        got = chunk_boundaries(cu, L, K).cpu()
        seq = sequence_index(cu, L).cpu()
        NC = -(-L // K)
        opens = torch.zeros(NC * K, dtype=torch.bool)
        opens[torch.tensor(offsets[:-1])] = True
        want_bits = [sum(1 << k for k in range(K) if opens[c * K + k]) for c in range(NC)]
        want_bits = [b - (1 << 32) if b >= 1 << 31 else b for b in want_bits]
        assert got[0].tolist() == want_bits, (offsets, K)
        assert got[1].tolist() == seq[::K].tolist(), (offsets, K)
        assert got[2].tolist() == [int(seq[min(c * K + K, L) - 1]) for c in range(NC)], (offsets, K)


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_step_opens_says_which_steps_of_chunks_open_a_sequence():
    """step_opens (a step of WC chunks without an opening skips its restarts): true exactly for the steps with an
    opening token, a last step that reaches past the last chunk included; a sequence opening at bit 31 counts."""
    from samu.ops.packing_triton import chunk_boundaries

    cases = ([0, 1, 200, 257, 300], [0, 300], [0, 95, 96, 191, 300], [0, 321, 330], [0, 330], [0, 63, 64, 200, 330])
    for K, WC in ((32, 2), (16, 4), (16, 1)):
        for offsets in cases:
            L = offsets[-1]
            words = chunk_boundaries(torch.tensor(offsets, dtype=torch.int32, device=DEVICE), L, K)
            NC = words.shape[1]
            steps = -(-NC // WC)
            out = torch.full((steps,), -1, dtype=torch.int32, device=DEVICE)
            _step_opens_kernel[(steps,)](words, out, NC, WC=WC)
            want = [int(any(s * WC * K <= t < (s + 1) * WC * K for t in offsets[:-1])) for s in range(steps)]
            assert out.tolist() == want, (K, WC, offsets, out.tolist(), want)


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
@pytest.mark.parametrize("op", ["samu", "rglru"])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_dropped_final_state_gets_no_cotangent(op, compiled, monkeypatch):
    """Training drops the mixers' final states: the Triton backward is handed None for them, eagerly and
    through torch.compile (zeros would make the packed kernels gather a cotangent at every token)."""
    import samu.ops.rglru.function as rglru_function
    import samu.ops.samu.function as samu_function

    module, name = (samu_function, "bwd") if op == "samu" else (rglru_function, "rglru_bwd")
    seen = []
    inner = getattr(module, name)

    def spy(dy, dh, *args, **kwargs):
        seen.append(dh)
        return inner(dy, dh, *args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    fn, params_of = _mixer(op)
    x = randn((1, 23, 16), 1, device=DEVICE).requires_grad_(True)
    params = params_of(16, 2, device=DEVICE)
    variant = "triton_grouped" if op == "samu" else "triton_chunked"
    cu = torch.tensor([0, 5, 23], dtype=torch.int32, device=DEVICE)

    def loss(x):
        return (fn(x, *params, backend=variant, cu_seqlens=cu)[0] ** 2).sum()

    torch._dynamo.reset()
    (torch.compile(loss, fullgraph=True, backend="aot_eager") if compiled else loss)(x).backward()
    assert len(seen) == 1 and seen[0] is None
