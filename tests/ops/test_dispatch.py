"""Backend choice: CPU defaults, named variants, float64, explain(), lazy Triton import."""

import subprocess
import sys

import pytest
import torch

import samu
from samu.ops import dispatch
from tests.helpers import randn, samu_params


def _samu_args(B=2, L=5, D=6):
    return [randn((B, L, D), 0, requires_grad=False), *[p.detach() for p in samu_params(D, 1)]]


def test_triton_backend_needs_cuda_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if not dispatch.triton_available():
        pytest.skip("triton is not installed")
    with pytest.raises(ValueError, match="Triton needs CUDA"):
        samu.samu_mixer(*_samu_args(), backend="triton")


def test_float64_is_torch_or_reference_only():
    args = [a.double() for a in _samu_args()]
    args[1:] = [a.float() for a in args[1:]]
    y, _ = samu.samu_mixer(*args)
    assert y.dtype == torch.float64
    if dispatch.triton_available():
        with pytest.raises(TypeError, match="not float64"):
            samu.samu_mixer(*args, backend="triton")


def test_auto_on_cpu_is_torch_and_explain_says_why():
    choice = dispatch.choose("samu", 1, 16, 8, torch.float32, "cpu")
    assert choice.backend == "torch" and "cpu" in choice.reason
    text = dispatch.explain((1, 16, 8), "rglru", torch.float32, "cpu")
    assert text.startswith("rglru (1, 16, 8) float32 on cpu: torch")


def test_cpu_auto_does_not_import_triton():
    code = ("import sys, torch, samu; m = samu.SAMUMixer(8); m(torch.randn(1, 4, 8)); "
            "r = samu.RGLRUMixer(8, num_heads=2); r(torch.randn(1, 4, 8)); "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"TRITON_INTERPRET": "0", "PATH": ""})
    assert out.stdout.strip() == "False"


def test_unknown_op_and_backend_type():
    with pytest.raises(ValueError, match="op must be one of"):
        dispatch.choose("mamba", 1, 4, 8, torch.float32, "cpu")
    with pytest.raises(TypeError, match="backend must be a string"):
        dispatch.choose("samu", 1, 4, 8, torch.float32, "cpu", 3)
