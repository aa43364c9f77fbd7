"""The test helpers themselves."""

import subprocess
import sys
from pathlib import Path

# in a fresh process: Dynamo records torch's functions once, when it is first imported
_AFTER_POISON = """
import warnings
import pytest
import torch
from torch import nn
from tests.helpers import poison_allocations

with pytest.MonkeyPatch.context() as patch:
    poison_allocations(patch)
    p = nn.Parameter(torch.randn(4))
    p.grad = torch.randn(4)
    torch.optim.AdamW([p], lr=1e-2).step()
    assert torch.empty_like(p).isnan().all()   # the patch was on


def f(x):
    return torch.empty_like(x).copy_(x) + 1


with warnings.catch_warnings(record=True) as shown:
    warnings.simplefilter("always")
    torch._dynamo.explain(f)(torch.randn(4))
print([str(w.message)[:120] for w in shown if "empty_like" in str(w.message)])
"""


def test_poisoned_allocations_leave_dynamo_able_to_trace_empty_like():
    # an optimizer's first step under poison_allocations (torch.optim imports Dynamo, which records torch's functions then)
    # left them holding the patched torch.empty_like: a compiled test run after the AdamW tests broke its graph at
    # every torch.empty_like (results/dev/session13/README.md, call4)
    # run from the repository's root, where ``-c`` finds the tests package
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _AFTER_POISON], capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
