import json

import pytest

from samu.bench.cli import main
from samu.bench.records import load_records, validate
from samu.gates import reload
from samu.ops import gate_status


def test_bench_gate_report_end_to_end_on_cpu(tmp_path, capsys):
    results = tmp_path / "results"
    assert main(["bench", "--device", "cpu", "--shapes", "1x12x8", "--scopes", "fwd,fb", "--peers", "none",
                 "--out", str(results / "bench" / "b.json"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "samu/auto" in out and "record:" in out
    status = tmp_path / "status.json"
    assert main(["gate", "--device", "cpu", "--ops", "rglru", "--shapes", "1x12x8", "--dtypes", "fp32",
                 "--backends", "torch", "--out", str(results / "gates"), "--results", str(results),
                 "--status", str(status), "--quiet"]) == 0
    reload()
    cpu = json.loads(status.read_text())["by_platform"][gate_status.device_platform("cpu")]
    assert cpu["passed"] == [["rglru", "torch", "float32|L<=8192|D<=1024"]]
    records = load_records(results)
    assert [r["kind"] for _, r in records] == ["bench", "gate"]
    assert all(validate(r) == [] for _, r in records)
    assert records[0][1]["command"].startswith("samu bench --device cpu")
    assert main(["report", "--results", str(results), "--brief"]) == 0
    report = (results / "REPORT.md").read_text()
    assert "[b.json](bench/b.json)" in report and "gates: 1 pass, 0 fail" in capsys.readouterr().out
    assert (results / "figures" / "samu_rglru_ratio.png").exists()


@pytest.mark.parametrize("argv", [
    ["bench", "--warmup", "2"],
    ["bench", "--samples", "4"],
    ["bench", "--shapes", "primary,huge"],
    ["bench", "--scopes", "fwd,nope"],
    ["bench", "--peers", "torch,lstm-scan"],
    ["gate", "--dtypes", "int8"],
    ["gate", "--ops", "lstm"],
])
def test_bad_arguments_are_refused_before_running(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--device", "cpu"])
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_samu_gate_adds_to_the_users_status_and_never_touches_the_packaged_one(tmp_path, monkeypatch):
    """The user's status is what the records samu keeps in its cache say, per platform: a block earned on a GPU
    outlives gates elsewhere and goes only with its record."""
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SAMU_GATE_STATUS", raising=False)
    packaged = gate_status.PACKAGED.read_bytes() if gate_status.PACKAGED.exists() else None
    user, kept = gate_status.user_file(), gate_status.user_records()
    cpu = gate_status.device_platform("cpu")
    results = tmp_path / "elsewhere"
    argv = ["gate", "--device", "cpu", "--ops", "rglru", "--shapes", "1x12x8", "--dtypes", "fp32", "--backends",
            "torch", "--out", str(results / "gates"), "--results", str(results), "--quiet"]
    passed = [["rglru", "torch", "float32|L<=8192|D<=1024"]]
    try:
        assert main(argv) == 0
        ((name, record),) = load_records(kept)
        status = json.loads(user.read_text())["by_platform"]
        assert status == {cpu: {"passed": passed, "blocked": [], "sources": [name]}}
        # the same class failed on an H200 (a record of its own in the cache): blocked there, passed here
        failed = json.loads(json.dumps(record))
        failed.update(run_id="h200", env=dict(record["env"], gpu="NVIDIA H200"), created="2000-01-01T00:00:00Z")
        failed["rows"][0]["pass"] = False
        (kept / "h200.json").write_text(json.dumps(failed))
        assert main(argv) == 0
        status = json.loads(user.read_text())["by_platform"]
        assert status[cpu]["passed"] == passed and status[cpu]["blocked"] == []
        h200 = f"NVIDIA H200|{cpu.split('|')[1]}"
        assert status[h200]["blocked"] == passed
        # --status-only brings --results' records in; quarantining the H200's record clears its block
        (kept / "quarantine").mkdir()
        (kept / "h200.json").rename(kept / "quarantine" / "h200.json")
        assert main(["gate", "--status-only", "--results", str(results)]) == 0
        assert list(json.loads(user.read_text())["by_platform"]) == [cpu]
        # the records already there are not copied again, nor is a quarantined one brought back
        (results / "h200.json").write_text(json.dumps(failed))
        assert main(["gate", "--status-only", "--results", str(results)]) == 0
        assert list(json.loads(user.read_text())["by_platform"]) == [cpu]
        assert len(load_records(kept)) == 2 and len(load_records(results)) == 3
        # a status an older samu merged from records it does not keep: a gate run keeps its blocks by refusing
        user.write_text(json.dumps({"passed": [], "blocked": passed, "platforms": [cpu]}))
        with pytest.raises(SystemExit, match="blocks 1 classes from records samu does not keep"):
            main(argv)
        assert json.loads(user.read_text())["blocked"] == passed
        assert (gate_status.PACKAGED.read_bytes() if gate_status.PACKAGED.exists() else None) == packaged
        assert not list(user.parent.glob(".*.tmp"))
    finally:
        monkeypatch.undo()
        reload()
