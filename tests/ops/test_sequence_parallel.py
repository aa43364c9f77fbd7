"""Sequence parallelism (samu.ops.sequence_parallel): a sequence split along L across 2 and 3 gloo processes
on the CPU equals one process's call on the whole sequence: outputs, the final state (on every rank), x's
gradient (each rank its shard's) and the parameters' and initial state's gradients (summed over the ranks).

Rule, declared before any run: fp32 relative Frobenius error below 1e-5 against one process's call with the
same backend (the sequence-parallel result composes the shards' maps in another order and forms the
transitions' products in float64), and the same against the float64 reference's outputs.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from samu import reference
from samu.ops.functional import rglru_mixer, samu_mixer
from samu.ops.sequence_parallel import rglru_mixer_sequence_parallel, samu_mixer_sequence_parallel
from tests.helpers import rel_err

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sequence_parallel_worker import inputs  # noqa: E402


def _one_process(op, L):
    x, params, h0, dy, dh = inputs(op, L, torch.float32)
    fn = samu_mixer if op == "samu" else rglru_mixer
    y, h = fn(x, *params, initial_state=h0, output_final_state=True, backend="torch")
    grads = torch.autograd.grad((y * dy).sum() + (h * dh).sum(), [x, h0, *params])
    ref = (reference.samu_mixer if op == "samu" else reference.rglru_mixer)(
        x.detach(), *[p.detach() for p in params], initial_state=h0.detach(), output_final_state=True)
    return y, h, grads, ref


@pytest.mark.parametrize("lengths", [(20, 17), (7, 1, 12)], ids=["2 ranks", "3 ranks, a one-token shard"])
def test_sequence_parallel_equals_one_process(tmp_path, lengths):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                          str(len(lengths)), str(ROOT / "tests" / "ops" / "sequence_parallel_worker.py"),
                          "--out", str(tmp_path), "--lengths", ",".join(map(str, lengths))],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"stderr:\n{run.stderr[-3000:]}"
    for op in ("samu", "rglru"):
        y, h, grads, (ref_y, ref_h) = _one_process(op, sum(lengths))
        ranks = [torch.load(tmp_path / f"{op}-{r}.pt") for r in range(len(lengths))]
        got_y = torch.cat([r["y"] for r in ranks], dim=1)
        assert rel_err(got_y, y) < 1e-5 and rel_err(got_y, ref_y) < 1e-5, op
        for r in ranks:
            assert rel_err(r["h"], h) < 1e-5 and rel_err(r["h"], ref_h) < 1e-5, op
        assert rel_err(torch.cat([r["grads"][0] for r in ranks], dim=1), grads[0]) < 1e-5, (op, "x")
        for i, want in enumerate(grads[1:], start=1):
            assert rel_err(sum(r["grads"][i] for r in ranks), want) < 1e-5, (op, i)
        # the shards do depend on one another: every rank's own share of the initial state's gradient is not
        # the whole of it
        assert all(rel_err(r["grads"][1], grads[1]) > 1e-3 for r in ranks[1:]), op


def test_without_a_process_group_says_so():
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="group: sequence parallelism needs an initialised"):
        samu_mixer_sequence_parallel(x, torch.zeros(4), torch.zeros(4), torch.ones(2, 8), torch.ones(2, 2))
    with pytest.raises(ValueError, match="group: sequence parallelism needs an initialised"):
        rglru_mixer_sequence_parallel(x, torch.zeros(2, 4, 4), torch.zeros(8), torch.zeros(2, 4, 4), torch.zeros(8),
                                      torch.zeros(8))
