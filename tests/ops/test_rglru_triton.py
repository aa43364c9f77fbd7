"""RG-LRU Triton kernels against the float64 reference (the Triton interpreter on CPU, CUDA with -m gpu).

Every check compares y, the final state, dx, d(initial_state) and every parameter gradient with
the float64 reference under the spec §7 gate rule (tests/helpers.gate_check).
"""

import pytest
import torch

import samu
from samu.ops import dispatch
from tests.helpers import assert_gate, assert_same_results_of_two_forms, gate_check, randn, rel_err, rglru_params

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every kernel output and scratch buffer starts as NaN, so an unwritten element fails the checks."""
    from samu.ops.rglru import triton_fwd

    previous = triton_fwd.poison_outputs(True)
    yield
    triton_fwd.poison_outputs(previous)


def _config(K=4, WC=4, WC_dx=0, target=1):
    from samu.ops.rglru.function import Config

    return Config(K=K, WC=WC, WC_dx=WC_dx, target_programs=target)


def _with_config(config):
    from samu.ops.rglru.function import run

    def mixer(x, w_a, b_a, w_x, b_x, a_param, *, initial_state=None, output_final_state=False, c=8.0):
        return run(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, config)

    return mixer


# (B, L, D, H, config): L not a multiple of the chunk or the step, L = 1, one chunk per step and
# several, several programs per batch row, dx steps longer than the others; head dims 8 and 16
# (padded to the 16-wide minimum tile), 12, and 80 (three channel tiles of 32, the last one partial)
CASES = [
    (2, 37, 32, 4, dict(K=16, WC=1)),
    (2, 70, 48, 4, dict(target=32, WC_dx=8)),
    (1, 1, 32, 4, dict(K=8, WC=2)),
    (3, 1, 16, 2, dict(K=8, WC=2)),
    (1, 50, 80, 5, dict(target=20, K=8, WC=2)),
    (1, 23, 160, 2, dict(target=4)),
]


@pytest.mark.parametrize("B,L,D,H,cfg", CASES)
def test_fp32_matches_reference(B, L, D, H, cfg):
    assert_gate(gate_check("rglru", _with_config(_config(**cfg)), torch.float32, B, L, D, H=H, seed=L + D,
                           device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_reference(dtype):
    assert_gate(gate_check("rglru", _with_config(_config(target=16)), dtype, 2, 45, 32, H=4, seed=5,
                           device=DEVICE))


def test_head_dim_160():
    """The medium primary shape's head dim: five channel tiles of 32 over a 256-wide padded head."""
    assert_gate(gate_check("rglru", _with_config(_config(target=2)), torch.bfloat16, 1, 19, 160, H=1, seed=7,
                           device=DEVICE))


@pytest.mark.parametrize("final_grad", [True, False])
def test_without_initial_state(final_grad):
    """final_grad False: nor a final-state cotangent, what training runs (the backward's form without one)."""
    assert_gate(gate_check("rglru", _with_config(_config(target=16)), torch.bfloat16, 2, 40, 32, H=4, seed=9,
                           with_state=False, device=DEVICE, final_grad=final_grad))


def test_public_backend_names():
    names = set(samu.dispatch.variants("rglru"))
    assert {"triton_chunked", "triton_chunked_precise"} <= names
    # every primary width is served (head dims 64, 128 and 160), and any head count dividing D
    chunked_variant = samu.dispatch.variants("rglru")["triton_chunked"]
    for D in (1024, 2048, 2560):
        assert chunked_variant.preference(1, 4096, D, 16) is not None
    assert chunked_variant.preference(1, 4096, 24, 8) is not None
    assert chunked_variant.preference(1, 4096, 24, 16) is None

    def chunked(*args, **kw):
        return samu.rglru_mixer(*args, backend="triton_chunked", **kw)

    assert_gate(gate_check("rglru", chunked, torch.float32, 1, 20, 32, H=4, seed=3, device=DEVICE))


def test_deterministic():
    """Same inputs, same bits: outputs and every gradient, twice."""
    from samu.ops.rglru.function import run

    config = _config(target=16)
    x = randn((2, 50, 32), 0, device=DEVICE)
    params = rglru_params(32, 4, 1, device=DEVICE)
    h0 = randn((2, 32), 2, device=DEVICE)
    gy = randn((2, 50, 32), 3, device=DEVICE, requires_grad=False)

    def once():
        y, h = run(x, *params, h0, 8.0, config)
        return [y, h, *torch.autograd.grad((y * gy).sum() + h.sum(), [x, h0, *params])]

    first, second = once(), once()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_split_sequence_carries_state():
    """Running [0, s) then [s, L) from the carried state equals the unsplit run (outputs and final state)."""
    from samu.ops.rglru.function import run

    config = _config(target=16)
    x = randn((2, 53, 32), 4, device=DEVICE, requires_grad=False)
    params = [p.detach() for p in rglru_params(32, 4, 5, device=DEVICE)]
    y, h = run(x, *params, None, 8.0, config)
    y1, h1 = run(x[:, :21], *params, None, 8.0, config)
    y2, h2 = run(x[:, 21:], *params, h1, 8.0, config)
    assert rel_err(torch.cat([y1, y2], 1), y) < 1e-6
    assert rel_err(h2, h) < 1e-6


def test_split_weights_reconstruct():
    """The bf16 parts hi + mid + lo reproduce every weight exactly, over twelve decades of scale,
    and the padding to the 16-wide tile is zero."""
    from samu.ops.rglru.triton_fwd import split_weights

    H, n = 3, 12
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2, H, n, n, generator=g) * torch.logspace(-6, 6, n)[None, None, :, None]
    w = w.to(DEVICE)
    w3 = split_weights(w[0], w[1])
    back = w3[:, :, :, :n, :n].double().sum(dim=1)
    assert torch.equal(back, w.double())
    assert (w3[:, :, :, n:, :] == 0).all() and (w3[:, :, :, :, n:] == 0).all()


def test_head_pieces_cover_every_head_dim():
    """Two power-of-two pieces (tl.dot's shapes) cover the head, the first the largest that fits,
    so only the second carries padding: none at 64, 96, 128 or 160."""
    import triton

    from samu.ops.rglru.triton_fwd import channel_block, head_pieces, weight_width

    assert [head_pieces(n) for n in (8, 12, 64, 80, 96, 128, 160)] == [
        (16, 0), (16, 0), (64, 0), (64, 16), (64, 32), (128, 0), (128, 32)]
    for n in range(1, 300):
        NPA, NPB = head_pieces(n)
        assert NPA >= 16 and NPA & (NPA - 1) == 0 and (NPA <= n or n < 16)
        assert NPB == 0 or (NPB >= 16 and NPB & (NPB - 1) == 0)
        assert n <= NPA + NPB <= weight_width(n)
        assert triton.cdiv(n, channel_block(n)) * channel_block(n) <= weight_width(n)


def test_custom_ops_opcheck():
    from samu.ops.rglru.function import rglru_bwd_op, rglru_fwd_op

    x = randn((1, 20, 16), 0, device=DEVICE)
    params = rglru_params(16, 1, 1, device=DEVICE)
    h0 = randn((1, 16), 2, device=DEVICE)
    checks = ("test_schema", "test_faketensor", "test_autograd_registration")
    # c, K, WC, G, G_dx, WC_dx, fast
    config = (8.0, 4, 4, 1, 1, 4, True)
    dy = randn((1, 20, 16), 3, device=DEVICE, requires_grad=False)
    plain = [t.detach() for t in (x, *params)]
    # unpacked, then packed (three sequences, states [3, D])
    cu = torch.tensor([0, 1, 9, 20], dtype=torch.int32, device=DEVICE)
    for offsets, h0 in ((None, h0), (cu, randn((3, 16), 2, device=DEVICE))):
        # with the final state, and without (an empty one: the kernels skip it)
        torch.library.opcheck(rglru_fwd_op, (x, *params, h0, offsets, *config, False), test_utils=checks)
        args = (x, *params, h0, offsets, *config, True)
        torch.library.opcheck(rglru_fwd_op, args, test_utils=checks)
        _, _, states, w3 = rglru_fwd_op(*args)
        dh = randn((h0.shape[0], 16), 4, device=DEVICE, requires_grad=False)
        torch.library.opcheck(rglru_bwd_op, (dy, dh, *plain, True, states.detach(), w3.detach(), offsets,
                                             h0.detach(), *config), test_utils=("test_schema", "test_faketensor"))


def _packed_config(config):
    from samu.ops.rglru.function import run

    def mixer(x, w_a, b_a, w_x, b_x, a_param, *, initial_state=None, output_final_state=False, c=8.0, cu_seqlens=None):
        return run(x, w_a, b_a, w_x, b_x, a_param, initial_state, c, config, cu_seqlens)

    return mixer


# packed sequences: lengths 1, a chunk exactly, a chunk and one, ragged; boundaries at chunk and step edges,
# a one-token sequence at a chunk's last token (23 for chunks of 8 and 4 tokens), and steps of 16 or 32 tokens
# in which no sequence opens, before and after one that opens (112) and at the end
PACKED = [0, 1, 9, 17, 18, 23, 24, 40, 41, 44, 112, 130]


# (config, initial states, a final-state cotangent): the second is the backward training runs (neither; its
# forward still keeps the final state: gate_check asks for it); the third, a final-state cotangent without
# initial states, is compiled apart from both
@pytest.mark.parametrize("cfg,with_state,final_grad", [(dict(K=8, WC=2), True, True),
                                                       (dict(target=8, K=8, WC=2, WC_dx=4), False, False),
                                                       (dict(K=8, WC=2), False, True)])
def test_packed_kernels_pass_the_gate_per_sequence(cfg, with_state, final_grad):
    """One packed call restarts at every boundary: each sequence against the reference run alone."""
    assert_gate(gate_check("rglru", _packed_config(_config(**cfg)), torch.float32, 1, PACKED[-1], 32, H=2, seed=7,
                           with_state=with_state, device=DEVICE, cu_seqlens=PACKED, final_grad=final_grad))


def test_packed_kernels_without_a_final_state_cotangent():
    """No final-state cotangent (the final state unused) gives the gradients of a zero one: bit for bit in the
    interpreter; on the GPU the form without one is compiled apart (it skips the cotangent's gather, which spills)
    and its products are contracted differently, so the two agree to fp32 rounding (they differed by up to 7e-8
    relative on the H200, results/dev/issue15/packed_3/diag_packed.txt). Each form is held to the reference by
    test_packed_kernels_pass_the_gate_per_sequence."""
    from samu.ops.rglru.function import run

    x = randn((1, PACKED[-1], 16), 3, device=DEVICE)
    params = rglru_params(16, 2, 4, device=DEVICE)
    h0 = randn((len(PACKED) - 1, 16), 5, device=DEVICE)
    cu = torch.tensor(PACKED, dtype=torch.int32, device=DEVICE)
    dy = randn(x.shape, 6, device=DEVICE, requires_grad=False)
    y, h = run(x, *params, h0, 8.0, _config(K=8, WC=2), cu)
    without = torch.autograd.grad(y, [x, h0, *params], dy)
    y, h = run(x, *params, h0, 8.0, _config(K=8, WC=2), cu)
    zero = torch.autograd.grad([y, h], [x, h0, *params], [dy, torch.zeros_like(h)])
    assert_same_results_of_two_forms(without, zero)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("with_state", [True, False])
def test_a_call_that_drops_the_final_state_equals_one_that_keeps_it(packed, with_state):
    """final=False (a caller that drops the final state: training, which has no initial state either) skips it in
    the kernels (packed, a scatter and a gather per token); y and every gradient are the same: bit for bit in the
    interpreter, to fp32 rounding on the GPU, where the form is compiled apart (each is gated: samu gate's
    |no_final results)."""
    from samu.ops.rglru.function import run

    x = randn((1, PACKED[-1], 16), 3, device=DEVICE)
    params = rglru_params(16, 2, 4, device=DEVICE)
    cu = torch.tensor(PACKED, dtype=torch.int32, device=DEVICE) if packed else None
    h0 = randn((len(PACKED) - 1 if packed else 1, 16), 5, device=DEVICE) if with_state else None
    leaves = [x, *params] + ([h0] if with_state else [])
    dy = randn(x.shape, 6, device=DEVICE, requires_grad=False)
    results = []
    for final in (True, False):
        y, h = run(x, *params, h0, 8.0, _config(K=8, WC=2), cu, final=final)
        assert (h is None) == (not final)
        results.append((y.detach(), *torch.autograd.grad(y, leaves, dy)))
    assert_same_results_of_two_forms(*results)


# ----------------------------------------------------------------------------------------------
# GPU: realistic shapes, torch.compile and CUDA graphs


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton_chunked", "triton_chunked_precise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,L,D", [(2, 1000, 1024), (1, 4097, 2048), (3, 777, 1536), (1, 2100, 2560)])
def test_gpu_gate(name, dtype, B, L, D):
    def mixer(*args, **kw):
        return samu.rglru_mixer(*args, backend=name, **kw)

    assert_gate(gate_check("rglru", mixer, dtype, B, L, D, H=16, seed=B + L, device="cuda"))


@pytest.mark.gpu
def test_gpu_compile_fullgraph():
    mixer = samu.RGLRUMixer(256, 16, backend="triton_chunked").cuda()
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def f(x):
        y, h = mixer(x, output_final_state=True)
        return y.float().sum() + h.sum()

    compiled = torch.compile(f, fullgraph=True)
    eager = f(x)
    assert rel_err(compiled(x), eager) < 1e-5
    explanation = torch._dynamo.explain(f)(x)
    assert explanation.graph_break_count == 0


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    params = [p.detach() for p in rglru_params(512, 16, 0, device="cuda")]
    x = torch.randn(2, 700, 512, device="cuda", dtype=torch.bfloat16)
    previous = samu.set_check_finite(False)
    try:
        y_eager, _ = samu.rglru_mixer(x, *params, backend="triton_chunked")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            samu.rglru_mixer(x, *params, backend="triton_chunked")
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_graph, _ = samu.rglru_mixer(x, *params, backend="triton_chunked")
        graph.replay()
        torch.cuda.synchronize()
    finally:
        samu.set_check_finite(previous)
    assert torch.equal(y_graph, y_eager)


def test_gate_class_names_head_dim_and_steps_per_group(tmp_path, monkeypatch):
    from samu.ops import gate_status
    from samu.ops.dispatch import gate_class

    v = samu.dispatch.variants("rglru")["triton_chunked"]
    one, eight = (gate_class(v, B, 8192, 1024, 16, torch.bfloat16) for B in (1, 8))
    assert "n=64" in one and one != eight  # more batch rows, fewer and longer groups: other numerics
    # a shorter sequence with the same steps per group is the same parenthesisation, so the same class
    assert gate_class(v, 1, 256, 1024, 16, torch.bfloat16) == gate_class(v, 1, 320, 1024, 16, torch.bfloat16)
    assert "n=128" in gate_class(v, 1, 8192, 1024, 8, torch.bfloat16)
    # with no record at all (on the GPU the committed ones could cover this class), the command that gates
    # it names the head count
    monkeypatch.setenv("SAMU_GATE_STATUS", str(tmp_path / "none.json"))
    gate_status.reload()
    try:
        choice = samu.dispatch.choose("rglru", 1, 8192, 1024, torch.bfloat16, DEVICE, "triton", heads=8, gate=False)
    finally:
        monkeypatch.undo()
        gate_status.reload()
    command = ("samu gate --ops rglru --shapes 1x8192x1024 --dtypes bfloat16 "
               "--backends triton_chunked,triton_chunked_precise --heads 8")
    assert choice.name == "torch" and command in choice.reason


def test_fp32_wide_heads_take_the_two_warp_dx_kernel_and_say_so():
    from samu.ops.dispatch import gate_class
    from samu.ops.rglru.function import CHUNKED, dx_chunks

    assert dx_chunks(CHUNKED, 160, torch.float32) == 2
    assert dx_chunks(CHUNKED, 160, torch.bfloat16) == dx_chunks(CHUNKED, 128, torch.float32) == CHUNKED.WC
    v = samu.dispatch.variants("rglru")["triton_chunked"]
    assert gate_class(v, 1, 32768, 2560, 16, torch.float32).endswith(",WCdx=2")
    assert "WCdx" not in gate_class(v, 1, 32768, 2560, 16, torch.bfloat16)


def test_leaner_options_reach_the_launches_of_their_passes_in_16_bit_only(monkeypatch):
    """LEANER's options (unpipelined, 128 registers) arrive at the launches of the pass and head dim they name, in
    bf16 and fp16 only; every other launch keeps its options. Each pass gets a different entry here, so swapped
    names show."""
    from samu.ops.rglru import triton_fwd

    seen = []
    real = triton_fwd.triton_launch

    def record(kernel, grid, *args, **meta):
        seen.append((kernel.fn.__name__, meta.get("SUMMARY"), meta.get("num_stages"), meta.get("maxnreg")))
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(triton_fwd, "triton_launch", record)
    monkeypatch.setattr(triton_fwd, "LEANER", {"summary": {8: "cap"}, "output": {8: "stage"},
                                               "bwd_summary": {16: "cap"}, "dw": {16: "stage"}})
    mixer = _with_config(_config(target=2))
    for dtype, n in ((torch.bfloat16, 8), (torch.bfloat16, 16), (torch.float16, 8), (torch.float32, 8)):
        seen.clear()
        x = randn((1, 9, 4 * n), 3, dtype=dtype, device=DEVICE).requires_grad_()
        y, _ = mixer(x, *rglru_params(4 * n, 4, 1, device=DEVICE))
        y.float().sum().backward()
        got = {(name, summary): (stages, maxnreg) for name, summary, stages, maxnreg in seen}
        lean = dtype != torch.float32
        assert got[("_rglru_chunk_kernel", True)] == ((1, 128) if lean and n == 8 else (2, None))
        assert got[("_rglru_chunk_kernel", False)] == ((1, None) if lean and n == 8 else (2, None))
        assert got[("_rglru_bwd_summary_kernel", None)] == ((1, 128) if lean and n == 16 else (2, None))
        assert got[("_rglru_bwd_dw_kernel", None)] == ((1, None) if lean and n == 16 else (2, None))
        assert got[("_rglru_bwd_dx_kernel", None)] == (2, None)
