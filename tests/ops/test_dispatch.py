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
    if not dispatch.triton_available():
        pytest.skip("triton is not installed")
    # kernels are decorated at import, under the interpreter setting of that moment: import them first
    dispatch.variants("samu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="Triton needs CUDA"):
        samu.samu_mixer(*_samu_args(), backend="triton")


def test_rocm_is_not_offered_the_kernels(monkeypatch):
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "ROCm build" in dispatch.triton_unusable(torch.device("cuda"))


def test_float64_is_torch_or_reference_only():
    # on a CUDA machine the kernels need CUDA tensors: there, CPU ones would be refused for their device, not dtype
    device = "cuda" if torch.cuda.is_available() else "cpu"
    args = [a.double().to(device) for a in _samu_args()]
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
    # unhashable ones too, where a remembered choice is looked up (a CUDA device with its index)
    for device in ("cpu", torch.device("cuda", 0)):
        with pytest.raises(TypeError, match="backend must be a string, got list"):
            dispatch.choose("samu", 1, 4, 8, torch.float32, device, ["torch"])
        with pytest.raises(ValueError, match="op must be one of"):
            dispatch.choose(["samu"], 1, 4, 8, torch.float32, device)
    with pytest.raises(ValueError, match="op must be one of samu, rglru, got 'lstm'"):
        dispatch.variants("lstm")


@pytest.mark.parametrize("args,match", [
    (((64, 1024),), r"shape must be \(B, L, D\)"), (((1, 0, 8),), r"shape must be \(B, L, D\)"),
    (((1, 5, 7),), "SAMU's width D must be even"), (((1, 5, 8), "samu", torch.long), "dtype must be a floating"),
    (((1, 5, 8), "lstm"), "op must be one of"),
])
def test_explain_refuses_what_no_call_could_be(args, match):
    with pytest.raises(ValueError, match=match):
        dispatch.explain(*args)


# First-use gating: a class no status covers is gated once in a child process (spec §6: a variant
# that failed a gate is never dispatched; one never gated is gated before it is).

needs_triton = pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")


def write_user(gate_status, status: dict) -> None:
    """The user's status as `samu gate` leaves it on the stand-in GPU (empty_status)."""
    import json

    path = gate_status.user_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(status, platforms=[gate_status.device_platform("cuda")])))


@pytest.fixture
def empty_status(tmp_path, monkeypatch):
    """No packaged verdicts, the user's status under tmp_path; restored afterwards."""
    from samu.ops import gate_status

    monkeypatch.setattr(gate_status, "PACKAGED", tmp_path / "packaged.json")
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    monkeypatch.delenv("SAMU_AUTO_GATE", raising=False)
    monkeypatch.setattr(dispatch, "_auto_tried", {})
    monkeypatch.setattr(dispatch, "_warned", set())
    # CUDA tensors on an H200 as far as dispatch's choice goes (the gate itself is a stand-in below)
    monkeypatch.setattr(dispatch, "_can_gate", lambda device: device.type == "cuda")
    monkeypatch.setattr(gate_status, "_gpu", lambda device: "NVIDIA H200" if torch.device(device).type == "cuda"
                        else None)
    gate_status.reload()
    yield gate_status
    monkeypatch.undo()
    gate_status.reload()


@needs_triton
def test_ungated_class_is_gated_once_in_a_child_and_then_dispatched(empty_status, monkeypatch, capsys):
    calls = []

    def fake_gate(cmd, **kw):
        # what the child `samu gate` leaves behind: the user's status with the class passed
        calls.append(cmd)
        names = cmd[cmd.index("--backends") + 1].split(",")
        variants = dispatch.variants("samu")
        status = {"passed": [["samu", n, dispatch.gate_class(variants[n], 1, 64, 8, 16, torch.bfloat16)]
                             for n in names], "blocked": []}
        write_user(empty_status, status)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(dispatch.subprocess, "run", fake_gate)
    choice = dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    assert choice.backend == "triton"
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "samu.bench", "gate"]
    # its record goes where the user's status is rebuilt from
    assert cmd[cmd.index("--out") + 1] == cmd[cmd.index("--results") + 1] == str(empty_status.user_records())
    assert cmd[cmd.index("--status") + 1] == str(empty_status.user_file())
    assert cmd[cmd.index("--shapes") + 1] == "1x64x8" and cmd[cmd.index("--dtypes") + 1] == "bfloat16"
    err = capsys.readouterr().err
    # one line on stderr when the gate passes
    assert err.count("\n") == 1 and err.startswith("samu: no gate record covers samu at (1, 64, 8) bfloat16")
    dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    assert len(calls) == 1


@needs_triton
def test_an_ungated_variant_that_would_rank_first_is_gated_before_a_gated_one_is_taken(empty_status, monkeypatch):
    variants = dispatch.variants("samu")
    cls = {n: dispatch.gate_class(variants[n], 1, 64, 8, 16, torch.bfloat16) for n in variants}
    # at 2 chunks the serial variant ranks first; only the grouped one has passed here
    write_user(empty_status, {"passed": [["samu", "triton_grouped", cls["triton_grouped"]]], "blocked": []})
    empty_status.reload()
    said = dispatch.explain((1, 64, 8), "samu", torch.bfloat16, "cuda")
    assert "triton_grouped ranks first" in said and "triton_serial would rank before it" in said
    calls = []

    def fake_gate(cmd, **kw):
        calls.append(cmd)
        status = {"passed": [["samu", n, cls[n]] for n in variants], "blocked": []}
        write_user(empty_status, status)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    # a trace gates nothing: it takes the gated variant, in one graph (also with SAMU_GATE_STATUS set, whose
    # reason text explain() alone builds)
    monkeypatch.setenv("SAMU_GATE_STATUS", str(empty_status.user_file()))
    empty_status.reload()

    def pick(x):
        return x + (1 if dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda").name == "triton_grouped" else 2)

    assert torch.compile(pick, fullgraph=True, backend="eager")(torch.zeros(1)).item() == 1
    monkeypatch.delenv("SAMU_GATE_STATUS")
    empty_status.reload()
    monkeypatch.setattr(dispatch.subprocess, "run", fake_gate)
    choice = dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    (cmd,) = calls
    assert cmd[cmd.index("--backends") + 1] == "triton_serial" and choice.variant.name == "triton_serial"


@needs_triton
def test_failed_first_use_gate_falls_back_once_and_says_so(empty_status, monkeypatch, capsys):
    calls = []

    def broken(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: no GPU\n")

    monkeypatch.setattr(dispatch.subprocess, "run", broken)
    for _ in range(2):
        assert dispatch.choose("rglru", 1, 64, 32, torch.bfloat16, "cuda", heads=2).backend == "torch"
    assert len(calls) == 1 and cmd_has_heads(calls[0], 2)
    assert "(1, 64, 32) bfloat16: RuntimeError: no GPU; it uses the chunked PyTorch path" in capsys.readouterr().err


def cmd_has_heads(cmd, heads):
    return cmd[cmd.index("--heads") + 1] == str(heads)


@needs_triton
def test_auto_gate_off_warns_once_with_the_command(empty_status, monkeypatch):
    monkeypatch.setenv("SAMU_AUTO_GATE", "0")
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail("must not gate"))
    with pytest.warns(UserWarning, match=r"SAMU_AUTO_GATE=0.*samu gate --ops samu --shapes 1x64x8"):
        assert dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda").backend == "torch"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")


@needs_triton
def test_ungated_class_inside_a_trace_is_an_error_naming_the_command(empty_status, monkeypatch):
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail("must not gate in a trace"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(dispatch, "_can_gate", lambda device: True)   # where an eager call would gate
    with pytest.raises(RuntimeError, match=r"never gates inside torch.compile.*samu gate --ops samu"):
        dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    # with gating off a trace refuses too until an eager call has warned; then it takes the eager call's path
    monkeypatch.setenv("SAMU_AUTO_GATE", "0")
    with pytest.raises(RuntimeError, match=r"never gates inside torch.compile"):
        dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    with pytest.warns(UserWarning, match="SAMU_AUTO_GATE=0"):
        assert dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda").backend == "torch"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda").backend == "torch"


@needs_triton
def test_blocked_class_is_never_dispatched_nor_regated(empty_status, monkeypatch):
    classes = {n: dispatch.gate_class(v, 1, 64, 8, 16, torch.bfloat16) for n, v in dispatch.variants("samu").items()}
    empty_status.user_file().parent.mkdir(parents=True)
    blocked = [["samu", n, c] for n, c in classes.items()]
    write_user(empty_status, {"passed": [], "blocked": blocked})
    empty_status.reload()
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail("must not gate a blocked class"))
    choice = dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda")
    assert choice.backend == "torch" and "blocked" in choice.reason
    with pytest.raises(ValueError, match="no Triton variant of samu has passed"):
        dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda", backend="triton")


@needs_triton
def test_explain_looks_without_gating(empty_status, monkeypatch):
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail("explain must not gate"))
    text = dispatch.explain((1, 64, 8), "samu", torch.bfloat16, "cuda")
    assert "no gate record covers this class" in text and "the first call gates it (`samu gate" in text


@needs_triton
def test_fallback_says_when_the_torch_path_failed_its_own_gate(empty_status):
    classes = {n: dispatch.gate_class(v, 1, 64, 8, 16, torch.float16) for n, v in dispatch.variants("samu").items()}
    blocked = [["samu", n, c] for n, c in classes.items()]
    blocked.append(["samu", "torch", dispatch.shape_class(64, 8, torch.float16)])
    empty_status.user_file().parent.mkdir(parents=True)
    write_user(empty_status, {"passed": [], "blocked": blocked})
    empty_status.reload()
    choice = dispatch.choose("samu", 1, 64, 8, torch.float16, "cuda")
    assert choice.backend == "torch" and "failed its own gate" in choice.reason


@needs_triton
def test_packed_calls_choose_by_packed_classes_or_run_per_sequence(empty_status, monkeypatch):
    variants = dispatch.variants("samu")
    assert all(v.packs for op in dispatch.OPS for v in dispatch.variants(op).values())
    # an unpacked pass does not speak for packed calls: the packed class is gated on first use, with --documents
    passed = [["samu", n, dispatch.gate_class(v, 1, 64, 8, 16, torch.bfloat16)] for n, v in variants.items()]
    empty_status.user_file().parent.mkdir(parents=True)
    write_user(empty_status, {"passed": passed, "blocked": []})
    empty_status.reload()
    calls = []

    def fake_gate(cmd, **kw):
        calls.append(cmd)
        names = cmd[cmd.index("--backends") + 1].split(",")
        packed = [["samu", n, dispatch.gate_class(variants[n], 1, 64, 8, 16, torch.bfloat16, packed=True)]
                  for n in names]
        write_user(empty_status, {"passed": passed + packed, "blocked": []})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(dispatch.subprocess, "run", fake_gate)
    assert dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda").backend == "triton" and not calls
    choice = dispatch.choose("samu", 1, 64, 8, torch.bfloat16, "cuda", packed=True)
    assert choice.backend == "triton" and choice.variant.packs and "|packed" in choice.reason
    (cmd,) = calls
    assert cmd[cmd.index("--documents") + 1] == str(dispatch.GATE_DOCUMENTS)
    # where no packing variant passed, one call per sequence
    blocked = [["samu", n, dispatch.gate_class(v, 1, 64, 8, 16, torch.float16, packed=True)]
               for n, v in variants.items()]
    write_user(empty_status, {"passed": [], "blocked": blocked})
    empty_status.reload()
    with pytest.warns(UserWarning, match="packed calls run one call per sequence") as said:
        for _ in range(2):   # said once
            assert dispatch.choose("samu", 1, 64, 8, torch.float16, "cuda", packed=True).backend == "per_sequence"
    assert len(said) == 1
    with pytest.raises(ValueError, match="no Triton variant of samu has passed its gate here"):
        dispatch.choose("samu", 1, 64, 8, torch.float16, "cuda", backend="triton", packed=True)
    assert dispatch.explain((1, 64, 8), "samu", torch.float16, "cuda", packed=True).endswith("one call per sequence)")
    name = sorted(variants)[0]
    assert dispatch.choose("samu", 1, 64, 8, torch.float16, "cuda", backend=name, packed=True).variant.name == name
    assert dispatch.choose("samu", 1, 64, 8, torch.float16, "cpu", packed=True).backend == "torch"


_real_can_gate = dispatch._can_gate
_real_gpu = dispatch.gate_status._gpu


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_first_use_gating_runs_the_real_gate_on_the_gpu_then_dispatches_triton(empty_status, monkeypatch, capsys):
    """The whole path on a GPU: no record covers the class, the first call gates it in a real child
    process, the user's status records the verdicts, and the call runs a Triton variant."""
    import json

    monkeypatch.setattr(dispatch, "_can_gate", _real_can_gate)
    monkeypatch.setattr(empty_status, "_gpu", _real_gpu)
    B, L, D = 1, 300, 64
    choice = dispatch.choose("samu", B, L, D, torch.bfloat16, torch.device("cuda"))
    assert choice.backend == "triton", choice.reason
    # the verdicts sit in this GPU's section of the user's status
    status = json.loads(empty_status.user_file().read_text())["by_platform"][empty_status.device_platform("cuda")]
    classes = {dispatch.gate_class(v, B, L, D, 16, torch.bfloat16) for v in dispatch.variants("samu").values()}
    assert classes <= {row[2] for row in status["passed"] if row[0] == "samu"}
    assert "gating it once" in capsys.readouterr().err
    args = [randn((B, L, D), 0, requires_grad=False).cuda().bfloat16(),
            *[p.detach().cuda() for p in samu_params(D, 1)]]
    y, _ = samu.samu_mixer(*args)
    ref, _ = samu.samu_mixer(*args, backend="torch")
    assert torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_a_caller_that_drops_the_final_state_tells_the_variants_that_can_skip_it(monkeypatch):
    """samu_mixer passes final=output_final_state to a variant with drops_final, and nothing to one without."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch.variants("samu")
    seen = {}

    def run_for(name):
        def run(x, *args, **kw):
            seen[name] = kw
            return x.clone(), x[:, -1].float()
        return run

    names = {"test_drops_final": True, "test_keeps_final": False}
    for name, drops in names.items():
        dispatch.register(dispatch.Variant("samu", name, run_for(name), lambda B, L, D, H: None,
                                           lambda B, L, D: ("0", 0), "test dummy", drops_final=drops))
    try:
        x = randn((1, 5, 8), 0)
        params = samu_params(8, 1)
        for wanted in (False, True):
            for name in names:
                y, h = samu.samu_mixer(x, *params, output_final_state=wanted, backend=name)
                assert (h is None) != wanted
            assert seen["test_drops_final"] == {"final": wanted} and seen["test_keeps_final"] == {}
    finally:
        for name in names:
            dispatch._VARIANTS["samu"].pop(name, None)


def test_an_eager_choice_on_a_cuda_device_is_remembered_until_the_status_is_read_again(monkeypatch):
    """choose costs an eager call 20-35 us on the host: a settled choice (no ungated variant in play) for a CUDA
    device with its index is remembered per argument set, and forgotten when the gate status is read again."""
    from samu.ops import gate_status

    calls, settled = [], {"value": True}
    choice = dispatch.Choice("triton", None, "stand-in")

    def fake(*args):
        calls.append(args)
        return choice, settled["value"]

    monkeypatch.setattr(dispatch, "_choose", fake)
    monkeypatch.setattr(dispatch, "_chosen", {})
    args = ("samu", 1, 64, 8, torch.bfloat16, torch.device("cuda", 0))
    assert dispatch.choose(*args) is choice and dispatch.choose(*args) is choice
    assert len(calls) == 1
    gate_status.reload()
    dispatch.choose(*args)
    assert len(calls) == 2
    # another backend, or "cuda" with no index (whichever device is current), is another question
    dispatch.choose(*args, backend="triton_serial")
    dispatch.choose(*args[:5], "cuda")
    dispatch.choose(*args[:5], "cuda")
    assert len(calls) == 5
    # where an ungated variant is in play the call may gate or warn: resolved afresh every time
    settled["value"] = False
    dispatch.choose(*args, heads=4)
    dispatch.choose(*args, heads=4)
    assert len(calls) == 7
    # so is every call on a CPU device
    settled["value"] = True
    dispatch.choose(*args[:5], torch.device("cpu"))
    dispatch.choose(*args[:5], torch.device("cpu"))
    assert len(calls) == 9


@needs_triton
def test_a_remembered_choice_follows_first_use_gating_the_status_and_registration(empty_status, monkeypatch):
    """The real choice on a CUDA device with its index: a call that gates is not remembered, the next is; a verdict
    reaches it through gate_status.reload(), a registration forgets everything, and with gating off an ungated class
    is resolved on every call."""
    import warnings

    variants = dispatch.variants("samu")
    cls = {n: dispatch.gate_class(variants[n], 1, 64, 8, 16, torch.bfloat16) for n in variants}
    real, runs, gates = dispatch._choose, [], []
    monkeypatch.setattr(dispatch, "_choose", lambda *a: runs.append(a) or real(*a))
    monkeypatch.setattr(dispatch, "_chosen", {})

    def fake_gate(cmd, **kw):
        gates.append(cmd)
        write_user(empty_status, {"passed": [["samu", n, cls[n]] for n in variants], "blocked": []})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(dispatch.subprocess, "run", fake_gate)
    args = ("samu", 1, 64, 8, torch.bfloat16, torch.device("cuda", 0))
    first = dispatch.choose(*args)
    assert first.backend == "triton" and len(gates) == 1 and len(runs) == 1
    assert dispatch.choose(*args).name == dispatch.choose(*args).name == first.name
    assert len(runs) == 2 and len(gates) == 1   # resolved once more after the gate, then remembered
    # the variant taken is blocked now: a file changed under the process is read at reload(), not before
    taken = first.name
    write_user(empty_status, {"passed": [["samu", n, cls[n]] for n in variants if n != taken],
                              "blocked": [["samu", taken, cls[taken]]]})
    assert dispatch.choose(*args).name == taken and len(runs) == 2
    empty_status.reload()
    after = dispatch.choose(*args)
    assert after.backend == "triton" and after.name != taken and len(runs) == 3
    dispatch.register(variants[after.name])
    dispatch.choose(*args)
    assert len(runs) == 4
    # first-use gating off and no record: the call may warn, so it is resolved afresh every time
    monkeypatch.setenv("SAMU_AUTO_GATE", "0")
    write_user(empty_status, {"passed": [], "blocked": []})
    empty_status.reload()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.choose(*args).backend == dispatch.choose(*args).backend == "torch"
    assert len(runs) == 6 and len(gates) == 1
