"""Shared test inputs and error measures (spec §7 conventions)."""

from __future__ import annotations

import numpy as np
import torch


def poison_allocations(monkeypatch) -> None:
    """Every floating tensor that torch.empty_like or Tensor.new_empty allocates starts as NaN, so an
    output element a kernel leaves unwritten fails the test that reads it."""
    # Dynamo records torch's functions as they are when it is first imported: imported here first, so that an
    # optimizer's first step under the patch (torch.optim imports it) cannot record the patched function and leave
    # later compiled tests unable to trace torch.empty_like
    import torch._dynamo  # noqa: F401

    empty_like, new_empty = torch.empty_like, torch.Tensor.new_empty

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **kw: nan(empty_like(t, *a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: nan(new_empty(self, *a, **kw)))


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error ||a - ref|| / ||ref||, computed in float64."""
    a, ref = a.detach().double(), ref.detach().double()
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


def samu_params(D: int, seed: int = 0, amplitude: float = 0.5, device="cpu"):
    """Random SAMU parameters: radii spanning (0.5, 0.9999), angles in (0, pi/10], non-zero amplitudes."""
    g = torch.Generator().manual_seed(seed)
    n = D // 2
    r = 0.5 + (0.9999 - 0.5) * torch.rand(n, generator=g, dtype=torch.float64)
    nu = torch.log(-torch.log(r)).float()
    theta_log = torch.log(0.01 + 0.3 * torch.rand(n, generator=g)).float()
    directions = torch.randn(2, D, generator=g)
    amplitudes = amplitude * torch.randn(2, 2, generator=g)
    return [t.to(device).requires_grad_() for t in (nu, theta_log, directions, amplitudes)]


def rglru_params(D: int, H: int, seed: int = 0, device="cpu"):
    """Random RG-LRU parameters: base decays spanning (0.5, 0.9999), gate weights N(0, 1/(D/H)), biases non-zero."""
    g = torch.Generator().manual_seed(seed)
    hd = D // H
    w_a = torch.randn(H, hd, hd, generator=g) / hd ** 0.5
    w_x = torch.randn(H, hd, hd, generator=g) / hd ** 0.5
    b_a = 0.5 * torch.randn(D, generator=g)
    b_x = 0.5 * torch.randn(D, generator=g)
    a0 = 0.5 + (0.9999 - 0.5) * torch.rand(D, generator=g, dtype=torch.float64)
    sp = -torch.log(a0)
    a_param = (sp + torch.log(-torch.expm1(-sp))).float()
    return [t.to(device).requires_grad_() for t in (w_a, b_a, w_x, b_x, a_param)]


def randn(shape, seed: int, dtype=torch.float32, device="cpu", requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype).requires_grad_(requires_grad)


def gate_check(op: str, run, x_dtype, B, L, D, H=4, seed=0, with_state=True, device="cpu", cu_seqlens=None,
               final_grad=True, params=None):
    """Run ``run`` (same signature as samu.samu_mixer / samu.rglru_mixer) through the spec §7 gate,
    judged by the gate runner's own functions on these test inputs. ``cu_seqlens`` (a list; B = 1): the
    call packs those sequences, each with its own initial and final state, against the reference run
    one sequence at a time. ``final_grad`` False leaves the final state out of the loss (as training does).
    ``params``: the mixer's parameters (default: samu_params or rglru_params drawn from ``seed + 1``).

    Returns the runner's verdict: {"errors", "thresholds", "passed", "pass", ...} over y,
    final_state, dx, d_initial_state (with_state) and every parameter gradient.
    """
    from samu.gates.inputs import PARAMS
    from samu.gates.rules import load_rules
    from samu.gates.runner import baselines, evaluate, judge

    rules = load_rules()
    if params is None:
        params = (samu_params(D, seed + 1, device=device) if op == "samu"
                  else rglru_params(D, H, seed + 1, device=device))
    inputs = {"x": randn((B, L, D), seed, dtype=torch.float32, device=device, requires_grad=False).to(x_dtype),
              "params": {name: p.detach() for name, p in zip(PARAMS[op], params)},
              "initial_state": randn((B, D), seed + 2, device=device, requires_grad=False) if with_state else None,
              # cotangents in the output's dtype; the final state is fp32
              "dy": randn((B, L, D), seed + 3, device=device, requires_grad=False).to(x_dtype),
              "dh": randn((B, D), seed + 4, device=device, requires_grad=False)}
    if cu_seqlens is not None:
        from samu.gates.inputs import pack_inputs

        inputs = pack_inputs(inputs, cu_seqlens, seed + 5)
        inputs["initial_state"] = inputs["initial_state"] if with_state else None
    if not final_grad:
        inputs["dh"] = None
    ref = evaluate(op, inputs, ref_dtype=torch.float64)
    serial_err, rounded_err = baselines(ref, evaluate(op, inputs, ref_dtype=torch.float32), x_dtype, rules)
    return judge(op, x_dtype, evaluate(op, inputs, run=run), ref, serial_err, rounded_err, rules)


def assert_float64_matches_reference(mixer, reference_mixer, x, params, h0):
    """A float64 run of ``mixer`` equals the float64 reference to rounding: outputs, state, gradients."""
    y, h = mixer(x, *params, initial_state=h0, output_final_state=True)
    y_ref, h_ref = reference_mixer(x, *params, initial_state=h0, output_final_state=True)
    assert rel_err(y, y_ref) < 1e-13 and rel_err(h, h_ref) < 1e-13
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    inputs = [x, h0, *params]
    for a, b in zip(torch.autograd.grad((y * gy).sum() + (h * gh).sum(), inputs),
                    torch.autograd.grad((y_ref * gy).sum() + (h_ref * gh).sum(), inputs)):
        assert rel_err(a, b) < 1e-12


def assert_same_results_of_two_forms(first, second):
    """Results of two kernel forms that differ in work skipped, not in arithmetic: bit for bit in the interpreter
    (CPU), within fp32 rounding on the GPU, where each form is compiled apart and its products may be contracted
    differently."""
    for a, b in zip(first, second):
        if a.device.type == "cpu":
            assert torch.equal(a, b)
        else:
            assert rel_err(a, b) < 1e-6


def assert_gate(verdict):
    failed = {q: (verdict["errors"][q], verdict["thresholds"][q]) for q, ok in verdict["passed"].items() if not ok}
    assert verdict["pass"] and not failed, "gate failed (error, threshold): " + ", ".join(
        f"{q}={v}" for q, v in failed.items())


def byte_text(folder, name="corpus.txt", seed=0):
    """A byte-text file with structure to learn (repeated lines of a few words); returns its path."""
    rng = np.random.default_rng(seed)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"(x)", b" = ", b"\n"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"".join(words[i] for i in rng.integers(0, len(words), 6000)))
    return path


@torch.no_grad()
def live_parameters(module, seed: int = 0):
    """``module`` with the parameters its init leaves at 0 or 1 drawn at random (every bias N(0, 0.5), every RMSNorm
    weight U(0.5, 1.5), RG-LRU's gate biases and SAMU's amplitudes, where zero, N(0, 0.5)), each in its own dtype and
    on its own device: a bias or norm weight taken in the wrong place then changes the results."""
    from samu.modules import RGLRUMixer, RMSNorm, SAMUMixer

    g = torch.Generator().manual_seed(seed)

    def draw(p, low=None, high=None):
        value = torch.empty(p.shape)
        value = value.normal_(0, 0.5, generator=g) if low is None else value.uniform_(low, high, generator=g)
        p.copy_(value)

    for m in module.modules():
        if isinstance(m, RMSNorm):
            draw(m.weight, 0.5, 1.5)
        elif getattr(m, "bias", None) is not None:
            draw(m.bias)
        zeroed = {SAMUMixer: ("amplitudes",), RGLRUMixer: ("b_a", "b_x")}.get(type(m), ())
        for p in (getattr(m, name) for name in zeroed):
            if not p.any():
                draw(p)
    return module
