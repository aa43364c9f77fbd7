"""samu compare: a tiny study on CPU (all three arms, two seeds, the long pair), its record, tables and
figures; a study cut short resumes to the same record; another definition in the folder is refused."""

import json

import pytest

from samu.cli import main
from samu.compare import Study, position_bins

ARGS = ["compare", "--preset", "tiny", "--seeds", "2", "--seq-len", "32", "--tokens", "384", "--batch-size", "4",
        "--long-seq-len", "64", "--long-tokens", "512", "--evals", "2", "--eval-batches", "1", "--device", "cpu",
        "--no-progress"]


def _study(tmp_path, name, extra=()):
    out, results = tmp_path / name, tmp_path / f"{name}-results"
    assert main([*ARGS, *extra, "--out", str(out), "--results", str(results)]) == 0
    (record,) = results.glob("*.json")
    return json.loads(record.read_text()), results


def test_a_tiny_study_trains_every_arm_alike_and_resumes(tmp_path, capsys, monkeypatch):
    record, results = _study(tmp_path, "a")
    runs = {r["name"]: r for r in record["runs"]}
    assert sorted(runs) == sorted([f"{arm}-L32-s{seed}" for arm in ("samu", "rglru", "transformer")
                                   for seed in (0, 1)] + ["samu-L64-s0", "rglru-L64-s0"])
    # the same steps and batches everywhere (3 steps of 4 x 32 tokens; the long pair 4 steps of 2 x 64)
    assert {(r["steps"], r["batch_size"]) for r in runs.values() if r["seq_len"] == 32} == {(3, 4)}
    assert {(r["steps"], r["batch_size"]) for r in runs.values() if r["seq_len"] == 64} == {(4, 2)}
    for r in runs.values():
        assert r["val"][0]["tokens"] == 0 and r["val"][-1]["tokens"] == r["steps"] * r["batch_size"] * r["seq_len"]
        assert len(r["position_bpb"]) == r["seq_len"] and all(b > 0 for b in r["position_bpb"])
    table = {(t["arm"], t["seq_len"]): t for t in record["table"]}
    assert sorted(table) == [("rglru", 32), ("rglru", 64), ("samu", 32), ("samu", 64), ("transformer", 32)]
    t = table[("samu", 32)]
    finals = [runs[f"samu-L32-s{s}"]["val"][-1]["bpb"] for s in (0, 1)]
    assert t["bpb"] == pytest.approx(sum(finals) / 2)
    assert t["bpb_spread"] == pytest.approx(abs(finals[0] - finals[1]) / 2)
    assert record["rglru_final_bpb"] == pytest.approx(table[("rglru", 32)]["bpb"])
    assert [(b["from"], b["to"]) for b in t["position_bins"]] == position_bins(32) == [(0, 16), (16, 32)]
    assert record["env"]["torch"] and record["command"].startswith("samu compare --preset tiny")
    assert len(list(results.glob("*.png"))) == 3
    # the report's comparison section, regenerated from the record with its figures
    from samu.bench.report import compare_section

    lines, figures = compare_section(results.parent / "res-root", None)
    assert lines[-2].startswith("No `samu compare` record")
    (results.parent / "res-root" / "compare").mkdir(parents=True)
    (record_path,) = results.glob("*.json")
    (results.parent / "res-root" / "compare" / record_path.name).write_text(record_path.read_text())
    lines, figures = compare_section(results.parent / "res-root", results.parent / "res-root" / "figures")
    assert len(figures) == 3 and any("| transformer | 32 | 2 |" in line for line in lines)
    out = capsys.readouterr().out
    assert "| samu | 32 | 2 |" in out and "Bits/byte by position in the context, L = 64" in out

    # the same study again: every run is kept, the record is the same
    again, _ = _study(tmp_path, "a")
    assert [r["val"] for r in again["runs"]] == [r["val"] for r in record["runs"]]
    assert "finished, kept" in capsys.readouterr().out

    # cut short (the fourth run stops after its first batch), then resumed: the same curves as unbroken
    from samu.data import TokenData

    sample, calls = TokenData.sample, []

    def stopping(self, *args):
        calls.append(1)
        if len(calls) == 3 * 3 + 2:
            raise KeyboardInterrupt
        return sample(self, *args)

    monkeypatch.setattr(TokenData, "sample", stopping)
    assert main([*ARGS, "--out", str(tmp_path / "b"), "--results", str(tmp_path / "b-results")]) == 130
    monkeypatch.setattr(TokenData, "sample", sample)
    resumed, _ = _study(tmp_path, "b")
    assert [(r["name"], [v["bpb"] for v in r["val"]]) for r in resumed["runs"]] == \
        [(r["name"], [v["bpb"] for v in r["val"]]) for r in record["runs"]]


def test_another_definition_is_refused_and_bad_options_name_themselves(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({**Study(preset="tiny").to_dict(), "seeds": 3}))
    assert main([*ARGS, "--out", str(folder), "--results", str(tmp_path / "r")]) == 1
    assert "holds another study (seeds (3 there" in capsys.readouterr().err
    assert main([*ARGS, "--arms", "samu,mamba", "--out", str(tmp_path / "t")]) == 1
    assert "arms must be distinct names among samu, rglru, transformer, got samu,mamba" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*ARGS, "--tokens", "lots"])
    assert "expected a token count such as 2000000 or 100M, got 'lots'" in capsys.readouterr().err
