"""The gate status dispatch reads: packaged verdicts, the user's overlay, SAMU_GATE_STATUS."""

import json
import warnings

import pytest
import torch

from samu.ops import gate_status


def _here(gpu="NVIDIA H200"):
    """A platform string for the installed Triton release."""
    from samu.environment import triton_version

    return gate_status.platform(gpu, triton_version())


@pytest.fixture
def status_files(tmp_path, monkeypatch):
    packaged, cache = tmp_path / "pkg" / "status.json", tmp_path / "cache"
    packaged.parent.mkdir()
    cache.mkdir()
    monkeypatch.setattr(gate_status, "PACKAGED", packaged)
    monkeypatch.setenv("SAMU_CACHE", str(cache))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    yield packaged, cache / "gate_status.json"
    monkeypatch.undo()
    gate_status.reload()


def test_user_verdicts_replace_packaged_ones_and_env_replaces_both(status_files, tmp_path, monkeypatch):
    packaged, user = status_files
    packaged.write_text(json.dumps({"passed": [["samu", "v", "c"], ["samu", "w", "c"]], "blocked": [],
                                    "platforms": [_here()]}))
    user.write_text(json.dumps({"passed": [], "blocked": [["samu", "v", "c"]], "platforms": [_here()]}))
    gate_status.reload()
    assert gate_status.verdict("samu", "v", "c") == "blocked" and gate_status.verdict("samu", "w", "c") == "passed"
    assert gate_status.verdict("samu", "x", "c") is None
    # the packaged file is never the default target of `samu gate`
    assert gate_status.status_path() == user
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"passed": [["rglru", "z", "c"]]}))
    monkeypatch.setenv("SAMU_GATE_STATUS", str(one))
    gate_status.reload()
    assert gate_status.status_path() == one
    assert gate_status.verdict("rglru", "z", "c") == "passed" and gate_status.verdict("samu", "w", "c") is None


def test_packaged_verdicts_speak_only_for_their_triton_release(status_files):
    packaged, _ = status_files
    packaged.write_text(json.dumps({"passed": [["samu", "w", "c"]], "platforms": ["NVIDIA H200|triton 0.1"]}))
    gate_status.reload()
    assert gate_status.verdict("samu", "w", "c") is None
    packaged.write_text(json.dumps({"passed": [["samu", "w", "c"]], "platforms": [_here()]}))
    gate_status.reload()
    assert gate_status.verdict("samu", "w", "c") == "passed"
    # never for the interpreter on CPU tensors: its verdicts come from its own gates
    assert gate_status.verdict("samu", "w", "c", device="cpu") is None


def test_the_users_verdicts_speak_only_for_the_platform_they_were_made_on(status_files, monkeypatch):
    """A Triton upgrade or another GPU (or CPU tensors, the interpreter) is not where the user's verdicts were
    earned: they apply only on their platform, while a file named by SAMU_GATE_STATUS applies everywhere."""
    _, user = status_files
    cpu = gate_status.platform("cpu", _here().split("triton ")[1])
    gpu = {"name": "NVIDIA H200"}
    monkeypatch.setattr(gate_status, "_gpu", lambda device: gpu["name"] if torch.device(device).type == "cuda"
                        else None)
    cases = [([_here()], "passed", None), ([_here("NVIDIA H100")], None, None),
             (["NVIDIA H200|triton 0.1"], None, None), ([cpu], None, "passed"), ([], None, None)]
    for platforms, on_gpu, on_cpu in cases:
        user.write_text(json.dumps({"passed": [["samu", "w", "c"]], "platforms": platforms}))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            gate_status.reload()
        # a file that names no platform speaks for none, and says so
        assert [str(w.message) for w in said if "names no platform" in str(w.message)] == ([] if platforms else [
            f"samu: gate status file {user} names no platform; its verdicts are ignored (rebuild it with "
            "`samu gate --status-only`)"])
        assert (gate_status.verdict("samu", "w", "c"), gate_status.verdict("samu", "w", "c", "cpu")) == (on_gpu, on_cpu)
    # where the GPU cannot be named (a trace before any eager call), a GPU platform of this Triton release speaks
    gpu["name"] = None
    for platforms, on_gpu in (([_here("NVIDIA H100")], "passed"), ([cpu], None), (["NVIDIA H200|triton 0.1"], None)):
        user.write_text(json.dumps({"passed": [["samu", "w", "c"]], "platforms": platforms}))
        gate_status.reload()
        assert gate_status.verdict("samu", "w", "c") == on_gpu
    # a file of several platforms: each section speaks for its own
    gpu["name"] = "NVIDIA H200"
    user.write_text(json.dumps({"by_platform": {_here(): {"blocked": [["samu", "w", "c"]]},
                                                cpu: {"passed": [["samu", "w", "c"]]}}}))
    gate_status.reload()
    on_gpu, on_cpu = gate_status.verdict("samu", "w", "c"), gate_status.verdict("samu", "w", "c", "cpu")
    assert (on_gpu, on_cpu) == ("blocked", "passed")
    # a status rebuilt from no record at all is no error
    empty = user.with_name("empty.json")
    empty.write_text(json.dumps({"by_platform": {}}))
    monkeypatch.setattr(gate_status, "user_file", lambda: empty)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gate_status.reload()
    assert gate_status.verdict("samu", "w", "c", "cpu") is None
    # a named file speaks for every device: each its own section, one with none all of them together (a block first)
    monkeypatch.setenv("SAMU_GATE_STATUS", str(user))
    gate_status.reload()
    on_gpu, on_cpu = gate_status.verdict("samu", "w", "c"), gate_status.verdict("samu", "w", "c", "cpu")
    assert (on_gpu, on_cpu) == ("blocked", "passed")
    gpu["name"] = "NVIDIA H100"
    assert gate_status.verdict("samu", "w", "c") == "blocked"


def test_an_unreadable_status_file_is_ignored_with_a_warning(status_files):
    _, user = status_files
    user.write_text("{not json")
    with pytest.warns(UserWarning, match="cannot be read"):
        gate_status.reload()
    assert gate_status.verdict("samu", "v", "c") is None


def test_packaged_status_lets_auto_take_triton_at_every_benchmark_and_training_shape(tmp_path, monkeypatch):
    """A fresh install on CUDA: the committed H200 status covers every gate shape (the benchmark
    shapes, the generation prefills and the presets' training shapes) in every dtype, for both
    mixers (RG-LRU with its default 16 heads)."""
    import torch

    from samu.bench.shapes import GATE
    from samu.ops import dispatch

    if not dispatch.triton_available():
        pytest.skip("triton is not installed")
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    monkeypatch.delenv("SAMU_AUTO_GATE", raising=False)
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail(f"gated {a}"))
    # as on a GPU: a class no record covers (or a better variant's) would be gated at once, failing this test
    monkeypatch.setattr(dispatch, "_can_gate", lambda device: device.type == "cuda")
    gate_status.reload()
    try:
        shapes = GATE
        missing = [(op, shape, dtype) for op in ("samu", "rglru") for shape in shapes
                   for dtype in (torch.bfloat16, torch.float16, torch.float32)
                   if dispatch.choose(op, *shape, dtype, "cuda").backend != "triton"]
        assert not missing
        assert "triton_" in dispatch.explain((1, 65536, 2048), "rglru", torch.bfloat16, "cuda")

        # the choice traces into one graph (torch.compile runs it in every compiled mixer call)
        def pick(x):
            return x + (1 if dispatch.choose("rglru", 1, 8192, 2048, torch.bfloat16, "cuda").backend == "triton"
                        else 2)

        assert torch.compile(pick, fullgraph=True, backend="eager")(torch.zeros(1)).item() == 1
    finally:
        monkeypatch.undo()
        gate_status.reload()
