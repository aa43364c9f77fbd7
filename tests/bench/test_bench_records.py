import json

import pytest
import torch

from samu.bench.peers import PEERS
from samu.bench.records import load_records, new_record, validate, write_record
from samu.environment import environment
from samu.bench.runner import run_bench
from samu.ops.checks import check_finite_enabled


@pytest.fixture(scope="module")
def cpu_record():
    """A real (tiny) bench run on CPU: its record is what the schema must accept."""
    before = check_finite_enabled()
    record = run_bench(["fwd", "fb"], [(1, 16, 8)], torch.float32, "cpu", with_peers=True, progress=False)
    assert check_finite_enabled() == before
    return record


def test_bench_record_matches_schema(cpu_record):
    assert validate(cpu_record) == []
    assert cpu_record["complete"] is True
    names = [r["candidate"] for r in cpu_record["rows"] if r["impl"] not in PEERS]
    assert names == ["samu/auto", "samu/torch", "rglru/auto", "rglru/torch"] * 2
    row = cpu_record["rows"][1]
    assert row["scope"] == "fwd" and row["shape"] == [1, 16, 8] and row["dtype"] == "float32"
    assert len(row["samples_ms"]) == 2 and all(len(r) == 5 for r in row["samples_ms"])
    assert row["floor_bytes"] == 2 * 16 * 8 * 4
    assert row["floor_ratio"] == pytest.approx(row["median_ms"] / row["floor_ms"])
    assert row["agreement"]["against"] == "samu/auto" and row["agreement"]["rel_error"] < 1e-6
    assert row["agreement"]["flagged"] is False and row["agreement"]["threshold"] > 1e-6
    assert row["choice"] == "torch" and row["choice_reason"] and row["peer"]
    assert not cpu_record["rows"][0]["peer"]
    # every peer is either timed or listed with the reason it could not run, never silently dropped
    seen = {s["candidate"] for s in cpu_record["skipped"]} | {r["candidate"] for r in cpu_record["rows"]}
    assert {"samu/ascan-complex", "rglru/fla-chunk_hgrn", "rglru/ascan-scalar"} <= seen
    assert all(s["reason"] for s in cpu_record["skipped"])
    env = cpu_record["env"]
    assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["git_commit"]
    assert cpu_record["copy_bandwidth"]["bytes_per_s"] > 0
    # the finiteness check is off while timing (restored afterwards, see the fixture) and recorded
    assert cpu_record["timing"]["check_finite"] is False


def test_validate_names_what_is_missing(cpu_record):
    broken = json.loads(json.dumps(cpu_record))
    del broken["rows"][0]["median_ms"]
    del broken["env"]["gpu"]
    broken["rows"][1]["shape"] = [1, 16]
    problems = validate(broken)
    assert "row 0 misses 'median_ms'" in problems
    assert "env misses 'gpu'" in problems
    assert any(p.startswith("row 1 shape") for p in problems)
    with pytest.raises(ValueError, match="median_ms"):
        write_record(broken, "unused.json")


def test_write_then_load_skips_quarantine_dev_and_foreign_json(tmp_path, cpu_record):
    path = write_record(cpu_record, tmp_path / "bench")
    assert path.parent == tmp_path / "bench" and path.name.startswith("bench-")
    (tmp_path / "quarantine").mkdir()
    (tmp_path / "quarantine" / "wrong.json").write_text(json.dumps(cpu_record))
    # a development study (results/dev) is cited, never read; a folder named dev deeper down is read
    (tmp_path / "dev" / "study").mkdir(parents=True)
    (tmp_path / "dev" / "study" / "few.json").write_text(json.dumps(cpu_record))
    (tmp_path / "bench" / "dev").mkdir()
    (tmp_path / "bench" / "dev" / "kept.json").write_text(json.dumps(cpu_record))
    (tmp_path / "status.json").write_text('{"blocked": []}')
    loaded = load_records(tmp_path)
    assert [p for p, _ in loaded] == [f"bench/{path.name}", "bench/dev/kept.json"]
    assert loaded[0][1] == cpu_record


def test_a_record_rewrites_itself_but_never_another_file(tmp_path, cpu_record):
    path = tmp_path / "r.json"
    write_record(cpu_record, path)
    cpu_record["rows"] = cpu_record["rows"][:1]   # the same run writing again as it goes
    assert json.loads(write_record(cpu_record, path).read_text())["rows"] == cpu_record["rows"]
    other = dict(cpu_record, run_id="another run")
    mine = tmp_path / "mine.json"
    mine.write_text('{"a": 1}')
    for target in (path, mine):
        before = target.read_text()
        with pytest.raises(FileExistsError, match="not this run's record"):
            write_record(other, target)
        assert target.read_text() == before
    # into a folder: another run of the same second takes a name of its own
    folder = tmp_path / "bench"
    first = write_record(cpu_record, folder)
    second = write_record(other, folder)
    assert second == first.with_name(first.stem + "-2.json") and json.loads(first.read_text()) == cpu_record
    assert write_record(other, folder) == second
    # a record without a run id (written before them) never takes over one that has one
    legacy = {k: v for k, v in cpu_record.items() if k != "run_id"}
    with pytest.raises(FileExistsError, match="not this run's record"):
        write_record(legacy, path)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(FileExistsError, match="is a file, not a folder or a .json record path"):
        write_record(cpu_record, notes)


def test_load_refuses_a_malformed_samu_record(tmp_path):
    record = new_record("gate", environment("cpu"), "samu gate")
    record["rows"].append({"op": "samu"})
    (tmp_path / "g.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="g.json"):
        load_records(tmp_path)


def test_a_mistyped_commit_override_is_refused(monkeypatch):
    """SAMU_GIT_COMMIT names the commit of a tree copied without .git: anything but hex digits is refused,
    so no record carries a commit nobody can find."""
    from samu.environment import git_state

    monkeypatch.setenv("SAMU_GIT_COMMIT", "c")
    git_state.cache_clear()
    with pytest.raises(ValueError, match="SAMU_GIT_COMMIT"):
        git_state()
    monkeypatch.setenv("SAMU_GIT_COMMIT", "3d53f32")
    git_state.cache_clear()
    assert git_state() == ("3d53f32", None)
    monkeypatch.delenv("SAMU_GIT_COMMIT")
    git_state.cache_clear()
