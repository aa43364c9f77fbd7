"""Sequence parallelism (samu.ops.sequence_parallel): a sequence split along L across 2 and 3 gloo processes
on the CPU equals the one-process computation: outputs, the final state (on every rank), x's gradient (each
rank its shard's) and the parameters' and initial state's gradients (summed over the ranks); and so does a
2-layer language model of each mixer split across 2 processes (logits and every parameter's gradient, within
1e-5: fp32 against fp32, the same ops in another order).

Rule, declared before any run: the gates' fp32 rule (samu/gates/gates.toml, spec §7) for every output and
gradient against the float64 reference, its serial fp32 evaluation giving the baseline; and one rank under
bf16 autocast equals the unsplit call under the same autocast within 1e-6.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from samu import reference
from samu.gates.rules import load_rules, rel_error
from samu.ops.functional import rglru_mixer, samu_mixer
from samu.ops.sequence_parallel import rglru_mixer_sequence_parallel, samu_mixer_sequence_parallel
from tests.helpers import rel_err
from tests.ops.sequence_parallel_worker import inputs, lm_inputs

ROOT = Path(__file__).resolve().parents[2]


def _reference(op, L, dtype):
    """(y, h, gradients of x, h0 and each parameter) of the serial reference evaluated in ``dtype``, for the
    worker's inputs and loss."""
    x, params, h0, dy, dh = inputs(op, L, torch.float32)
    fn = reference.samu_mixer if op == "samu" else reference.rglru_mixer
    y, h = fn(x, *params, initial_state=h0, output_final_state=True, dtype=dtype)
    grads = torch.autograd.grad((y * dy.to(dtype)).sum() + (h * dh.to(dtype)).sum(), [x, h0, *params])
    return [y, h, *grads]


@pytest.mark.parametrize("lengths", [(20, 17), (7, 1, 12)], ids=["2 ranks", "3 ranks, a one-token shard"])
def test_sequence_parallel_equals_one_process(tmp_path, lengths):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(len(lengths)), str(ROOT / "tests" / "ops" / "sequence_parallel_worker.py"),
                          "--out", str(tmp_path), "--lengths", ",".join(map(str, lengths))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"stderr:\n{run.stderr[-3000:]}"
    rules = load_rules()
    names = ["y", "final_state", "dx", "d_initial_state", "d_params 0", "d_params 1", "d_params 2", "d_params 3",
             "d_params 4"]
    for op in ("samu", "rglru"):
        exact, serial = _reference(op, sum(lengths), torch.float64), _reference(op, sum(lengths), torch.float32)
        ranks = [torch.load(tmp_path / f"{op}-{r}.pt") for r in range(len(lengths))]
        got = [torch.cat([r["y"] for r in ranks], dim=1), ranks[-1]["h"],
               torch.cat([r["grads"][0] for r in ranks], dim=1),
               *[sum(r["grads"][i] for r in ranks) for i in range(1, len(ranks[0]["grads"]))]]
        assert len(got) == len(exact)
        for name, g, e, s in zip(names, got, exact, serial):
            limit, _ = rules.threshold(name, torch.float32, rel_error(s, e), None)
            assert rel_error(g, e) <= limit, (op, name, rel_error(g, e), limit)
        # the final state is the same on every rank, and the shards depend on one another: no rank after the
        # first holds the whole initial state's gradient alone
        assert all(torch.equal(r["h"], ranks[-1]["h"]) for r in ranks), op
        assert all(rel_err(r["grads"][1], exact[3]) > 1e-3 for r in ranks[1:]), op
    if min(lengths) < 3:
        return
    # a whole language model split the same way (RecurrentBlock: the Conv1D's halo and the mixers' summaries)
    for mixer in ("samu", "rglru"):
        model, tokens, cot = lm_inputs(mixer, sum(lengths))
        logits, _ = model(tokens)
        grads = torch.autograd.grad((logits * cot).sum(), list(model.parameters()))
        ranks = [torch.load(tmp_path / f"lm-{mixer}-{r}.pt") for r in range(len(lengths))]
        assert rel_err(torch.cat([r["logits"] for r in ranks], dim=1), logits) < 1e-5, mixer
        for i, (name, _) in enumerate(model.named_parameters()):
            assert rel_err(sum(r["grads"][i] for r in ranks), grads[i]) < 1e-5, (mixer, name)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("op", ["samu", "rglru"])
def test_one_rank_under_autocast_is_the_mixer(one_rank, op):
    """Under bf16 autocast the transitions' products stay in fp32, as in the mixers' own paths: one rank's
    sequence-parallel call is the plain call plus a correction from a zero state, the same within 1e-6."""
    x, params, h0, _, _ = inputs(op, 300, torch.float32)
    plain = samu_mixer if op == "samu" else rglru_mixer
    split = samu_mixer_sequence_parallel if op == "samu" else rglru_mixer_sequence_parallel
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = plain(x, *params, initial_state=h0, output_final_state=True, backend="torch")
        got = split(x, *params, initial_state=h0, output_final_state=True, backend="torch")
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-6


def test_without_a_process_group_says_so():
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="group: sequence parallelism needs an initialised"):
        samu_mixer_sequence_parallel(x, torch.zeros(4), torch.zeros(4), torch.ones(2, 8), torch.ones(2, 2))
    with pytest.raises(ValueError, match="group: sequence parallelism needs an initialised"):
        rglru_mixer_sequence_parallel(x, torch.zeros(2, 4, 4), torch.zeros(8), torch.zeros(2, 4, 4), torch.zeros(8),
                                      torch.zeros(8))


def test_a_shard_of_the_wrong_rank_is_named(one_rank):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"x must have shape \[B, L, D\]"):
        samu_mixer_sequence_parallel(x, torch.zeros(4), torch.zeros(4), torch.ones(2, 8), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"x must have shape \[B, L, D\]"):
        rglru_mixer_sequence_parallel(x, torch.zeros(2, 4, 4), torch.zeros(8), torch.zeros(2, 4, 4), torch.zeros(8),
                                      torch.zeros(8))


def _shift_inputs(dtype, B=2, L=70, N=40, seed=0):
    """y0, the controller's sums (mass, drift), nu, theta_log and an entering state, leaves for autograd: two
    tiles of tokens (the second ragged) and two of modes (the second ragged) of the correction kernels."""
    g = torch.Generator().manual_seed(seed)
    y0 = torch.randn(B, L, 2 * N, generator=g).to(dtype)
    mass = (0.5 + torch.rand(B, L, generator=g, dtype=torch.float64)).cumsum(1)
    drift = torch.remainder((3 * torch.randn(B, L, generator=g, dtype=torch.float64)).cumsum(1), 2 * math.pi)
    nu = torch.log(0.02 * torch.rand(N, generator=g, dtype=torch.float64) + 1e-3).float()
    theta_log = torch.log(0.01 + 0.3 * torch.rand(N, generator=g)).float()
    h = torch.randn(B, 2 * N, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (y0, mass, drift, nu, theta_log, h)]


def test_the_fused_correction_equals_the_pytorch_one():
    """SAMU's correction y0 + P h as its Triton kernels (the interpreter here) against the PyTorch form in
    float64: the output and the gradients of y0, both sums, nu, theta_log and h within 1e-5 (fp32 against
    float64 over 70 tokens; declared before the first run); in bf16 the output within bf16 rounding (4e-3)."""
    from samu.ops.samu.triton_shift import SamuShift
    from samu.ops.sequence_parallel import _samu_shift_torch

    for dtype, limit in ((torch.float32, 1e-5), (torch.bfloat16, 4e-3)):
        leaves = _shift_inputs(dtype)
        exact_leaves = [t.detach().double().requires_grad_() for t in leaves]
        y = SamuShift.apply(*leaves)
        want = _samu_shift_torch(*exact_leaves, torch.float64)
        assert y.dtype == dtype and rel_err(y, want) < limit, (dtype, rel_err(y, want))
        if dtype != torch.float32:
            continue
        cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        got = torch.autograd.grad((y * cot).sum(), leaves)
        exact = torch.autograd.grad((want * cot.double()).sum(), exact_leaves)
        names = ["y0", "mass", "drift", "nu", "theta_log", "h"]
        for name, g, e, leaf in zip(names, got, exact, leaves):
            assert g.dtype == leaf.dtype and rel_err(g, e) < limit, (name, rel_err(g, e))
        # the same bits again: fixed-order sums
        assert all(torch.equal(a, b) for a, b in zip(got, torch.autograd.grad((SamuShift.apply(*leaves) * cot).sum(),
                                                                                leaves)))


def test_one_rank_with_the_fused_correction_is_the_mixer(one_rank):
    """One rank's call through a Triton variant (the fused correction) equals the variant's own call with the
    initial state: outputs, final state and every gradient within 1e-5 (fp32, declared before the first run)."""
    x, params, h0, dy, dh = inputs("samu", 20, torch.float32)
    runs = []
    for fn in (samu_mixer, samu_mixer_sequence_parallel):
        y, h = fn(x, *params, initial_state=h0, output_final_state=True, backend="triton_serial")
        runs.append([y, h, *torch.autograd.grad((y * dy).sum() + (h * dh).sum(), [x, h0, *params])])
    for i, (g, w) in enumerate(zip(runs[1], runs[0])):
        assert rel_err(g, w) < 1e-5, (i, rel_err(g, w))
