"""The gate status dispatch reads: packaged verdicts, the user's overlay, SAMU_GATE_STATUS."""

import json
import os

import pytest

from samu.ops import gate_status


def test_status_files_user_overrides_packaged_and_env_replaces_both(tmp_path, monkeypatch):
    packaged, cache = tmp_path / "pkg" / "status.json", tmp_path / "cache"
    packaged.parent.mkdir()
    packaged.write_text(json.dumps({"passed": [["samu", "v", "c"], ["samu", "w", "c"]], "blocked": []}))
    cache.mkdir()
    (cache / "gate_status.json").write_text(json.dumps({"passed": [], "blocked": [["samu", "v", "c"]]}))
    monkeypatch.setattr(gate_status, "PACKAGED", packaged)
    monkeypatch.setenv("SAMU_CACHE", str(cache))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    try:
        gate_status.reload()
        assert gate_status.verdict("samu", "v", "c") == "blocked" and gate_status.verdict("samu", "w", "c") == "passed"
        assert gate_status.verdict("samu", "x", "c") is None
        packaged.parent.chmod(0o500)
        if not os.access(packaged.parent, os.W_OK):  # root may write anyway
            assert gate_status.status_path() == cache / "gate_status.json"
        packaged.parent.chmod(0o700)
        one = tmp_path / "one.json"
        one.write_text(json.dumps({"passed": [["rglru", "z", "c"]]}))
        monkeypatch.setenv("SAMU_GATE_STATUS", str(one))
        gate_status.reload()
        assert gate_status.passed() == {("rglru", "z", "c")} and not gate_status.blocked()
        one.write_text("{not json")
        with pytest.raises(ValueError, match="cannot be read"):
            gate_status.reload()
    finally:
        monkeypatch.undo()
        gate_status.reload()


def test_packaged_status_lets_auto_take_triton_at_every_benchmark_and_training_shape(tmp_path, monkeypatch):
    """A fresh install on CUDA: the committed H200 status covers every primary, length, width and
    training shape in every dtype, for both mixers (RG-LRU with its default 16 heads)."""
    import torch

    from samu.bench.shapes import LENGTH, PRIMARY, TRAIN, WIDTH
    from samu.ops import dispatch

    if not dispatch.triton_available():
        pytest.skip("triton is not installed")
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    monkeypatch.setattr(dispatch.subprocess, "run", lambda *a, **k: pytest.fail(f"gated {a}"))
    gate_status.reload()
    try:
        missing = [(op, shape, dtype) for op in ("samu", "rglru") for shape in dict.fromkeys(PRIMARY + LENGTH + WIDTH + TRAIN)
                   for dtype in (torch.bfloat16, torch.float16, torch.float32)
                   if dispatch.choose(op, *shape, dtype, "cuda").backend != "triton"]
        assert not missing
        assert "triton_" in dispatch.explain((1, 65536, 2048), "rglru", torch.bfloat16, "cuda")
    finally:
        monkeypatch.undo()
        gate_status.reload()
