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
