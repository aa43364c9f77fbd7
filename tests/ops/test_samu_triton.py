"""SAMU Triton kernels against the float64 reference (the Triton interpreter on CPU, CUDA with -m gpu)."""

import pytest
import torch

import samu
from samu.ops import dispatch
from tests.helpers import assert_gate, assert_same_results_of_two_forms, gate_check, randn, rel_err, samu_params

pytestmark = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _nan_empty(*shape, **kw):
    dtype = kw.get("dtype") or torch.get_default_dtype()
    return torch.full(shape, float("nan") if dtype.is_floating_point else 12345, **kw)


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every kernel output starts as NaN (integers as 12345: the prefix counters the forward must zero), so an
    element a kernel forgets to write fails the checks."""
    from samu.ops.samu import function

    function.set_allocator(_nan_empty)
    yield
    function.set_allocator(torch.empty)


def _with_config(config):
    from samu.ops.samu.function import run

    def mixer(x, nu, theta_log, directions, amplitudes, *, initial_state=None, output_final_state=False,
              radial_bound=2.0):
        return run(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, config)

    return mixer


def _config(K, BN, G, unroll=2, main_BN=0):
    from samu.ops.samu.function import Config

    return Config(K=K, BN=BN, G=G, unroll=unroll, main_BN=main_BN)


# (B, L, D, K, BN, G, unroll): L not a multiple of K, L = 1 (serial and grouped), a ragged last
# group, N not a multiple of BN, a last chunk of one token after others (the backward's trig: token 0 comes from
# the last chunk's lanes past L). The interpreter runs tl.range loops as plain loops, so the unroll
# cases check only the plumbing; test_unrolled_walks_pass_the_gate_on_gpu checks the compiled code.
# the last: a width whose 512 modes outnumber the forward controller's one program of 16 tokens x 256 modes
SHAPES = [(2, 37, 10, 8, 4, 1, 1), (2, 37, 10, 8, 4, 2, 2), (1, 1, 6, 8, 4, 3, 1), (2, 1, 6, 8, 4, 1, 1),
          (2, 32, 12, 16, 4, 2, 1), (1, 70, 8, 4, 2, 4, 3), (2, 33, 10, 8, 4, 2, 1), (1, 16, 1024, 8, 128, 2, 2)]


@pytest.mark.parametrize("B,L,D,K,BN,G,unroll", SHAPES)
def test_fp32_matches_reference(B, L, D, K, BN, G, unroll):
    assert_gate(gate_check("samu", _with_config(_config(K, BN, G, unroll)), torch.float32, B, L, D, seed=L + G,
                           device=DEVICE))


# the main backward on its own mode tile (as dispatched from D > 128: up to 128 modes in the walks, 64 there),
# narrower and wider than the walks' tile, N a multiple of neither (the partial sums' layout follows the main
# tile); unpacked and packed
@pytest.mark.parametrize("BN,main_BN,G,packed", [(8, 4, 2, False), (4, 8, 1, True)])
def test_a_main_tile_other_than_the_walks_passes_the_gate(BN, main_BN, G, packed):
    config = _config(8, BN, G, main_BN=main_BN)
    if packed:
        assert_gate(gate_check("samu", _packed_config(config), torch.float32, 1, 21, 22, seed=BN + G, device=DEVICE,
                               cu_seqlens=[0, 1, 9, 21]))
    else:
        assert_gate(gate_check("samu", _with_config(config), torch.float32, 2, 21, 22, seed=BN + G, device=DEVICE))


@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_reference(dtype, G):
    assert_gate(gate_check("samu", _with_config(_config(4, 4, G)), dtype, 2, 27, 10, seed=7, device=DEVICE))


def test_without_initial_state():
    assert_gate(gate_check("samu", _with_config(_config(8, 4, 2)), torch.float32, 2, 29, 8, seed=8,
                           with_state=False, device=DEVICE))


@pytest.mark.parametrize("variant", ["triton_serial", "triton_grouped"])
def test_named_variants_through_public_api(variant):
    def mixer(*args, **kw):
        return samu.samu_mixer(*args, backend=variant, **kw)

    assert_gate(gate_check("samu", mixer, torch.float32, 1, 40, 6, seed=9, device=DEVICE))


@pytest.mark.parametrize("G", [1, 2])
def test_deterministic_bits(G):
    B, L, D = 2, 21, 6
    x = randn((B, L, D), 1, device=DEVICE)
    params = samu_params(D, 2, device=DEVICE)
    h0 = randn((B, D), 3, device=DEVICE)
    mixer = _with_config(_config(8, 4, G))
    runs = []
    for _ in range(2):
        y, h = mixer(x, *params, initial_state=h0, output_final_state=True)
        grads = torch.autograd.grad((y * y).sum() + h.sum(), [x, h0, *params])
        runs.append([y, h, *grads])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("G", [1, 2])
def test_saves_only_spec_3_1_and_the_prefix_counters(G):
    """Saved for backward besides x and the parameters: p, (m, phi) [B, 4, L], the boundary states
    [B, ceil(L/K), D] fp32 and the two direction norms; nothing per token and mode. Beside them, the prefix
    counters, which hold no value of the forward: a few int32 zeros a call, which the backward's prefix counts
    with (so that it needs no launch to zero its own; docs/spec.md notes it). The backward leaves them zero
    too, so a second backward of the same graph gives the same bits."""
    from samu.ops.samu.function import run

    B, L, D, K = 2, 21, 10, 8
    x = randn((B, L, D), 4, device=DEVICE).requires_grad_()
    params = [p.requires_grad_() for p in samu_params(D, 5, device=DEVICE)]
    h0 = randn((B, D), 6, device=DEVICE).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y, h = run(x, *params, h0, 2.0, _config(K, 4, G))
    inputs = {t.data_ptr() for t in [x, h0, *params]}
    extra = sorted((tuple(t.shape), t.dtype) for t in saved if t.data_ptr() not in inputs)
    n_chunks = -(-L // K)
    # the two direction norms 1 / ||u_j|| are derived from a parameter, not per-token state
    # counters: batch rows, mode tiles (N = 5 modes, 4 a tile), one a group (G > 1) and the outer one
    counters = (B, 2, (-(-n_chunks // G) if G > 1 else 0) + 1)
    assert extra == sorted([((2,), torch.float32), ((B, 4, L), torch.float32), ((B, n_chunks, D), torch.float32),
                            (counters, torch.int32)])
    # and nothing is kept beside save_for_backward
    assert not [k for k, v in vars(y.grad_fn).items() if isinstance(v, torch.Tensor)]
    (count,) = [t for t in saved if t.dtype == torch.int32]
    assert torch.equal(count, torch.zeros_like(count))
    grads = []
    for _ in range(2):
        grads.append(torch.autograd.grad((y * y).sum() + h.sum(), [x, h0, *params], retain_graph=True))
        assert torch.equal(count, torch.zeros_like(count))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_rtu_degeneration():
    """Zero amplitudes: the kernels compute the time-invariant RTU to fp32 rounding."""
    B, L, D = 2, 40, 12
    n = D // 2
    x = randn((B, L, D), 4, requires_grad=False, device=DEVICE)
    nu, theta_log, directions, _ = [p.detach() for p in samu_params(D, 5, device=DEVICE)]
    y, _ = _with_config(_config(8, 4, 2))(x, nu, theta_log, directions, torch.zeros(2, 2, device=DEVICE))
    r = torch.exp(-torch.exp(nu.double()))
    lam = torch.polar(r, torch.exp(theta_log.double()))
    gamma = torch.sqrt(1 - r * r)
    h = torch.zeros(B, n, dtype=torch.complex128, device=DEVICE)
    ys = []
    for t in range(L):
        h = lam * h + gamma * torch.complex(x[:, t, :n].double(), x[:, t, n:].double())
        ys.append(torch.cat([h.real, h.imag], -1))
    assert rel_err(y, torch.stack(ys, 1)) < 1e-6


def test_matches_torch_path_with_split_sequence():
    """The kernels over [0, cut) then [cut, L) from the carried state equal their unsplit run and the torch path's:
    outputs, final state and every gradient, which reaches the first part's x through the carried state."""
    B, L, D, cut = 2, 50, 8, 19
    x = randn((B, L, D), 6, device=DEVICE)
    params = samu_params(D, 7, device=DEVICE)
    dy = randn((B, L, D), 8, device=DEVICE, requires_grad=False)
    dh = randn((B, D), 9, device=DEVICE, requires_grad=False)
    mixer = _with_config(_config(8, 4, 2))
    y, h = mixer(x, *params, output_final_state=True)
    y1, h1 = mixer(x[:, :cut], *params, output_final_state=True)
    y2, h2 = mixer(x[:, cut:], *params, initial_state=h1, output_final_state=True)
    y_split = torch.cat([y1, y2], 1)
    assert rel_err(y_split, y) < 1e-6 and rel_err(h2, h) < 1e-6
    y_torch, h_torch = samu.samu_mixer(x, *params, output_final_state=True, backend="torch")
    assert rel_err(y_split, y_torch) < 1e-6 and rel_err(h2, h_torch) < 1e-6
    leaves = [x, *params]
    split = torch.autograd.grad([y_split, h2], leaves, [dy, dh])
    unsplit_torch = torch.autograd.grad([y_torch, h_torch], leaves, [dy, dh])
    # a parameter gradient adds up B * L * N fp32 products in each of two orders: 1e-5, past the outputs' 1e-6
    for name, a, b in zip(["x", "nu", "theta_log", "directions", "amplitudes"], split, unsplit_torch):
        assert rel_err(a, b) < 1e-5, f"d{name}: {rel_err(a, b)}"


def _packed_config(config):
    from samu.ops.samu.function import run

    def mixer(x, nu, theta_log, directions, amplitudes, *, initial_state=None, output_final_state=False,
              radial_bound=2.0, cu_seqlens=None):
        return run(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, config, cu_seqlens)

    return mixer


# packed sequences: lengths 1, a chunk exactly, a chunk and one, ragged; boundaries at chunk edges and inside
# and a one-token sequence at a chunk's last token (23 for chunks of 8 and 4 tokens)
PACKED = [0, 1, 9, 17, 18, 23, 24, 40, 41, 44, 70]
# the first six of them (lengths 1, 8, 8, 1, 5, 1: the last at a chunk's last token), for tests that hold two
# forms of the kernels to each other
SHORT = PACKED[:7]


# (K, BN, G, initial states, a final-state cotangent): the last is what training runs (neither)
@pytest.mark.parametrize("K,BN,G,with_state,final_grad", [(8, 4, 1, True, True), (8, 4, 2, False, True),
                                                          (4, 4, 4, False, False)])
def test_packed_kernels_pass_the_gate_per_sequence(K, BN, G, with_state, final_grad):
    """One packed call restarts at every boundary: each sequence against the reference run alone."""
    assert_gate(gate_check("samu", _packed_config(_config(K, BN, G)), torch.float32, 1, PACKED[-1], 10, seed=K + G,
                           with_state=with_state, device=DEVICE, cu_seqlens=PACKED, final_grad=final_grad))


def test_packed_kernels_without_a_final_state_cotangent():
    """No final-state cotangent (the final state unused) gives the gradients of a zero one, bit for bit."""
    from samu.ops.samu.function import run

    x = randn((1, SHORT[-1], 8), 3, device=DEVICE)
    params = samu_params(8, 4, device=DEVICE)
    h0 = randn((len(SHORT) - 1, 8), 5, device=DEVICE)
    cu = torch.tensor(SHORT, dtype=torch.int32, device=DEVICE)
    dy = randn(x.shape, 6, device=DEVICE, requires_grad=False)
    y, h = run(x, *params, h0, 2.0, _config(8, 4, 2), cu)
    without = torch.autograd.grad(y, [x, h0, *params], dy)
    y, h = run(x, *params, h0, 2.0, _config(8, 4, 2), cu)
    zero = torch.autograd.grad([y, h], [x, h0, *params], [dy, torch.zeros_like(h)])
    for a, b in zip(without, zero):
        assert torch.equal(a, b)


@pytest.mark.parametrize("packed", [False, True])
def test_a_call_that_drops_the_final_state_equals_one_that_keeps_it(packed):
    """final=False (a caller that drops the final state: training) skips it in the replay (packed, a store
    per sequence's last token); y and every gradient are the same: bit for bit in the interpreter, to fp32
    rounding on the GPU, where the form is compiled apart (each is gated: samu gate's |no_final results)."""
    from samu.ops.samu.function import run

    x = randn((1, SHORT[-1], 8), 3, device=DEVICE)
    params = samu_params(8, 4, device=DEVICE)
    cu = torch.tensor(SHORT, dtype=torch.int32, device=DEVICE) if packed else None
    h0 = randn((len(SHORT) - 1 if packed else 1, 8), 5, device=DEVICE)
    dy = randn(x.shape, 6, device=DEVICE, requires_grad=False)
    results = []
    for final in (True, False):
        y, h = run(x, *params, h0, 2.0, _config(8, 4, 2), cu, final=final)
        assert (h is None) == (not final)
        results.append((y.detach(), *torch.autograd.grad(y, [x, h0, *params], dy)))
    assert_same_results_of_two_forms(*results)


def test_custom_ops_pass_opcheck():
    from samu.ops.samu.function import Config, samu_fwd

    B, L, D = 1, 9, 8
    config = Config(K=8, BN=4, G=2, slots_per_sm=3, main_BN=2).as_list()
    x = randn((B, L, D), 8, device=DEVICE)
    nu, theta_log, directions, amplitudes = samu_params(D, 9, device=DEVICE)
    h0 = randn((B, D), 10, device=DEVICE)
    # packed: three sequences, states [3, D]; each with the final state and without (an empty one)
    cu = torch.tensor([0, 1, 5, 9], dtype=torch.int32, device=DEVICE)
    for offsets, h0 in ((None, h0), (cu, randn((3, D), 10, device=DEVICE))):
        for want_final in (True, False):
            torch.library.opcheck(samu_fwd, (x, nu, theta_log, directions, amplitudes, h0, offsets, 2.0, config,
                                             want_final),
                                  test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_compiles_without_graph_breaks():
    """torch.compile traces the mixer as one custom op (fake implementations, registered autograd)."""
    from samu.ops.samu.function import Config, run

    B, L, D = 1, 9, 8
    x = randn((B, L, D), 11, device=DEVICE)
    params = samu_params(D, 12, device=DEVICE)

    def loss(x, *params):
        y, h = run(x, *params, None, 2.0, Config(8, 4, 2))
        return (y * y).sum() + h.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x, *params), [x, *params])
    want = torch.autograd.grad(loss(x, *params), [x, *params])
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # a packed call traces too: the offsets are a tensor input, their sequence index computed by torch ops
    cu = torch.tensor([0, 2, 9], dtype=torch.int32, device=DEVICE)

    def packed_loss(x, cu, *params):
        y, h = run(x, *params, None, 2.0, Config(8, 4, 2), cu_seqlens=cu)
        return (y * y).sum() + (h * h).sum()

    compiled = torch.compile(packed_loss, fullgraph=True, backend="aot_eager")
    for offsets in (cu, torch.tensor([0, 4, 5, 9], dtype=torch.int32, device=DEVICE)):
        got = torch.autograd.grad(compiled(x, offsets, *params), [x, *params])
        want = torch.autograd.grad(packed_loss(x, offsets, *params), [x, *params])
        for a, b in zip(got, want):
            assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton_serial", "triton_grouped"])
def test_prefix_composed_by_any_arrival_gives_the_same_bits(variant):
    """On the GPU a group's summary programs finish in any order, so any of them may compose the group's prefix (the
    interpreter runs them in order: the last chunk always does). Many groups, a ragged last group (94 chunks of 32
    tokens in groups of 16) and a ragged last mode tile (500 modes in tiles of 128): five calls give the same bits,
    and the call passes the gate."""
    B, L, D = 3, 3000, 1000
    x = randn((B, L, D), 1, device=DEVICE)
    params = samu_params(D, 2, device=DEVICE)
    h0 = randn((B, D), 3, device=DEVICE)

    def mixer(*args, **kw):
        return samu.samu_mixer(*args, backend=variant, **kw)

    runs = []
    for _ in range(5):
        y, h = mixer(x, *params, initial_state=h0, output_final_state=True)
        grads = torch.autograd.grad((y * y).sum() + h.sum(), [x, h0, *params])
        runs.append([y, h, *grads])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    assert_gate(gate_check("samu", mixer, torch.float32, B, L, D, seed=4, device=DEVICE))


@pytest.mark.gpu
def test_cuda_graph_capture_replays_the_same_bits():
    from samu.ops.samu.function import grouped_config, run

    B, L, D = 2, 3000, 256
    x = randn((B, L, D), 13, device="cuda", dtype=torch.bfloat16)
    params = samu_params(D, 14, device="cuda")
    dy = torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16)

    def step():
        y, _ = run(x, *params, None, 2.0, grouped_config(B, L, D))
        return torch.autograd.grad(y, [x, *params], dy)

    eager = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("unroll", [2, 3, 4])
@pytest.mark.parametrize("G", [1, 4])
def test_unrolled_walks_pass_the_gate_on_gpu(unroll, G):
    """The compiled token walks with an unroll factor (one that does not divide K among them)."""
    assert_gate(gate_check("samu", _with_config(_config(32, 64, G, unroll)), torch.bfloat16, 2, 1000, 256,
                           seed=unroll, device="cuda"))
    assert_gate(gate_check("samu", _with_config(_config(32, 64, G, unroll)), torch.float32, 1, 777, 200,
                           seed=unroll + 10, device="cuda"))
