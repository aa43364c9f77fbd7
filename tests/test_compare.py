"""samu compare: a tiny study on CPU (all three arms, two seeds, the long pair), its record, tables and
figures; a study cut short resumes to the same record; another definition in the folder is refused."""

import json
import statistics

import pytest
import torch

from samu.cli import main
from samu.compare import Study, _time_to, position_bins

ARGS = ["compare", "--preset", "tiny", "--seeds", "2", "--seq-len", "32", "--tokens", "384", "--batch-size", "4",
        "--long-seq-len", "64", "--long-tokens", "512", "--evals", "2", "--eval-batches", "1", "--device", "cpu",
        "--no-progress"]


def _study(tmp_path, name, extra=()):
    out, results = tmp_path / name, tmp_path / f"{name}-results"
    assert main([*ARGS, *extra, "--out", str(out), "--results", str(results)]) == 0
    (record,) = results.glob("*.json")
    return json.loads(record.read_text()), results


def test_a_tiny_study_trains_every_arm_alike_and_resumes(tmp_path, capsys, monkeypatch):
    from samu.data import TokenData

    sample, drawn = TokenData.sample, []

    def recording(self, batch_size, seq_len, rng, pack=False):
        x, y, cu = sample(self, batch_size, seq_len, rng, pack)
        drawn.append(x)
        return x, y, cu

    monkeypatch.setattr(TokenData, "sample", recording)
    record, results = _study(tmp_path, "a")
    monkeypatch.setattr(TokenData, "sample", sample)
    runs = {r["name"]: r for r in record["runs"]}
    names = [r["name"] for r in record["runs"]]
    assert sorted(runs) == sorted([f"{arm}-L32-s{seed}" for arm in ("samu", "rglru", "transformer")
                                   for seed in (0, 1)] + ["samu-L64-s0", "rglru-L64-s0"])
    # the same batches in the same order for every arm of a seed (3 steps a run at L = 32; runs 0-2 are
    # seed 0, runs 3-5 seed 1), and for both arms of the long pair (4 steps each)
    batches = [drawn[3 * i:3 * i + 3] for i in range(6)] + [drawn[18:22], drawn[22:26]]
    assert len(drawn) == 26

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    assert same(batches[0], batches[1]) and same(batches[0], batches[2]) and same(batches[3], batches[5])
    assert same(batches[6], batches[7]) and not same(batches[0], batches[3])
    # the same steps and batches everywhere (3 steps of 4 x 32 tokens; the long pair 4 steps of 2 x 64)
    assert {(r["steps"], r["batch_size"]) for r in runs.values() if r["seq_len"] == 32} == {(3, 4)}
    assert {(r["steps"], r["batch_size"]) for r in runs.values() if r["seq_len"] == 64} == {(4, 2)}
    assert names[:3] == ["samu-L32-s0", "rglru-L32-s0", "transformer-L32-s0"]
    for r in runs.values():
        assert r["val"][0]["tokens"] == 0 and r["val"][-1]["tokens"] == r["steps"] * r["batch_size"] * r["seq_len"]
        assert r["val"][0]["time_s"] == 0 and r["val"][-1]["time_s"] > 0
        assert len(r["position_bits"]) == r["seq_len"] and all(b > 0 for b in r["position_bits"])
        # the same windows as the final validation, each position counted alike: their mean is its bits
        assert statistics.fmean(r["position_bits"]) == pytest.approx(r["val"][-1]["bits"], rel=1e-9)
    assert record["unit"] == "bits/byte"
    table = {(t["arm"], t["seq_len"]): t for t in record["table"]}
    assert sorted(table) == [("rglru", 32), ("rglru", 64), ("samu", 32), ("samu", 64), ("transformer", 32)]
    t = table[("samu", 32)]
    finals = [runs[f"samu-L32-s{s}"]["val"][-1]["bits"] for s in (0, 1)]
    assert t["bits"] == pytest.approx(sum(finals) / 2)
    assert t["bits_spread"] == pytest.approx(abs(finals[0] - finals[1]) / 2)
    assert table[("samu", 64)]["bits_spread"] is None   # one seed: no spread
    # each run against the RG-LRU run of its own seed: RG-LRU reaches its own final bits at its end
    assert table[("rglru", 32)]["reached_rglru"] == 2 and table[("transformer", 32)]["paired_with_rglru"] == 2
    rglru_end = [runs[f"rglru-L32-s{s}"]["val"][-1]["time_s"] for s in (0, 1)]
    assert table[("rglru", 32)]["time_to_rglru_s"] == pytest.approx(sum(rglru_end) / 2)
    assert [(b["from"], b["to"]) for b in t["position_bins"]] == position_bins(32) == [(0, 16), (16, 32)]
    for b in t["position_bins"]:
        per_seed = [statistics.fmean(runs[f"samu-L32-s{s}"]["position_bits"][b["from"]:b["to"]]) for s in (0, 1)]
        assert b["bits"] == pytest.approx(statistics.fmean(per_seed))
    assert record["env"]["torch"] and record["command"].startswith("samu compare --preset tiny")
    assert len(list(results.glob("*.png"))) == 3
    out = capsys.readouterr().out
    assert "| samu | 32 | 2 |" in out and "Bits/byte by position in the context, L = 64:" in out
    # the report's comparison section, regenerated from the record with its figures
    from samu.bench.report import compare_section

    root = tmp_path / "res-root"
    lines, _ = compare_section(root, None)
    assert lines[-2].startswith("No `samu compare` record")
    (root / "compare").mkdir(parents=True)
    (record_path,) = results.glob("*.json")
    (root / "compare" / record_path.name).write_text(record_path.read_text())
    lines, figures = compare_section(root, root / "figures")
    assert len(figures) == 3 and any("| transformer | 32 | 2 |" in line for line in lines)

    # the same study again into the same results: every run is kept, and the record holding them is not repeated
    assert main([*ARGS, "--out", str(tmp_path / "a"), "--results", str(results)]) == 0
    assert f"record: {record_path} holds these runs already; nothing written" in capsys.readouterr().out
    assert list(results.glob("*.json")) == [record_path]
    # ... and into empty results: a record of them is written there
    for old in results.glob("*"):
        old.unlink()
    again, _ = _study(tmp_path, "a")
    assert [r["val"] for r in again["runs"]] == [r["val"] for r in record["runs"]]
    assert "finished, kept" in capsys.readouterr().out

    # a finished run is kept from its log and positions alone: its checkpoints may be gone
    for old in results.glob("*"):
        old.unlink()
    for ckpt in (tmp_path / "a").glob("*/checkpoint*.pt"):
        ckpt.unlink()
    again, _ = _study(tmp_path, "a")
    assert [r["val"] for r in again["runs"]] == [r["val"] for r in record["runs"]]
    assert [r["position_bits"] for r in again["runs"]] == [r["position_bits"] for r in record["runs"]]
    assert capsys.readouterr().out.count("finished, kept") == len(record["runs"])
    # ... but not as another run's: a finished log of other settings is refused, naming them
    log_path = tmp_path / "a" / "samu-L32-s0" / "log.json"
    log = json.loads(log_path.read_text())
    log["config"]["lr"] = 0.5
    log_path.write_text(json.dumps(log))
    assert main([*ARGS, "--out", str(tmp_path / "a"), "--results", str(results)]) == 1
    assert "lr (0.5 there, 0.003 here)" in capsys.readouterr().err
    # ... or of other data
    log["config"]["lr"] = 0.003
    log["data"]["identity"]["train"]["blake2b"] = "0" * 32
    log_path.write_text(json.dumps(log))
    assert main([*ARGS, "--out", str(tmp_path / "a"), "--results", str(results)]) == 1
    assert "train split differs in content" in capsys.readouterr().err

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
    assert [(r["name"], [v["bits"] for v in r["val"]]) for r in resumed["runs"]] == \
        [(r["name"], [v["bits"] for v in r["val"]]) for r in record["runs"]]


def test_another_definition_is_refused_and_bad_options_name_themselves(tmp_path, capsys):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({**Study(preset="tiny").to_dict(), "seeds": 3}))
    assert main([*ARGS, "--out", str(folder), "--results", str(tmp_path / "r")]) == 1
    assert "holds another study (--seeds (3 there, 2 here)" in capsys.readouterr().err
    assert main([*ARGS, "--arms", "samu,mamba", "--out", str(tmp_path / "t")]) == 1
    assert "--arms must be distinct names among samu, rglru, transformer, got samu,mamba" in capsys.readouterr().err
    assert main([*ARGS, "--long-seq-len", "32", "--out", str(tmp_path / "t")]) == 1
    assert "--long-seq-len must exceed --seq-len=32 (or be 0: no long pair), got 32" in capsys.readouterr().err
    # a study whose data cannot load claims no folder: a corrected retry into it starts
    assert main([*ARGS, "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "u")]) == 1
    assert capsys.readouterr().err and not (tmp_path / "u" / "study.json").exists()
    for bad in ("lots", "inf", "1e400", "2.5", "-3"):
        with pytest.raises(SystemExit):
            main([*ARGS, "--tokens", bad])
        assert f"expected a whole token count such as 2000000 or 100M, got {bad!r}" in capsys.readouterr().err


def test_time_to_a_target_interpolates_between_validations():
    curve = [{"bits": 8.0, "time_s": 0.0}, {"bits": 4.0, "time_s": 10.0}, {"bits": 2.0, "time_s": 30.0}]
    assert _time_to(curve, 3.0) == pytest.approx(20.0)
    assert _time_to(curve, 4.0) == pytest.approx(10.0)
    assert _time_to(curve, 2.0) == pytest.approx(30.0) and _time_to(curve, 1.9) is None
    assert position_bins(8192) == [(0, 16), (16, 64), (64, 256), (256, 1024), (1024, 4096), (4096, 8192)]


def _record(created, arms=("samu", "rglru", "transformer"), seeds=2, long_seq_len=8192, bits=None, run="a",
            **study):
    """A samu compare record of a made-up study: ``bits`` maps arm to (mean, half-range) at L = 2048; its runs
    carry the run ids ``<run>-<arm>``."""
    definition = {**Study(arms=arms, seeds=seeds, long_seq_len=long_seq_len, **study).to_dict()}
    bits = bits or {arm: (1.3, 0.01) for arm in arms}
    table = [{"arm": arm, "seq_len": 2048, "seeds": list(range(seeds)), "params": 1e6, "bits": b, "bits_spread": s,
              "tokens_per_s": 1e5, "tokens_per_s_spread": None, "time_to_rglru_s": None, "time_to_rglru_spread_s": None,
              "reached_rglru": 0, "paired_with_rglru": 0, "position_bins": []} for arm, (b, s) in bits.items()]
    runs = [{"name": arm, "run_id": f"{run}-{arm}", "val": [{"bits": b}]} for arm, (b, _) in bits.items()]
    return {"schema": "samu-compare/1", "study": definition, "unit": "bits/byte", "table": table, "runs": runs,
            "created": created, "env": {"gpu": "GPU", "git_commit": "abc1234"}, "command": "samu compare"}


def test_a_rerun_is_judged_against_the_spread_of_the_study_it_reruns(tmp_path):
    from samu.bench.report import compare_section
    from samu.compare import is_rerun_of, rerun_rows, study_of

    study = _record("2026-01-01T00:00:00Z", bits={"samu": (1.30, 0.01), "rglru": (1.25, 0.002),
                                                  "transformer": (1.40, None)})
    one = _record("2026-01-02T00:00:00Z", arms=("samu",), seeds=1, long_seq_len=0, bits={"samu": (1.312, None)},
                  run="b")
    two = _record("2026-01-03T00:00:00Z", arms=("rglru", "transformer"), long_seq_len=0, run="c",
                  bits={"rglru": (1.2519, 0.001), "transformer": (1.41, 0.0)})
    assert is_rerun_of(one, study) and is_rerun_of(two, study) and not is_rerun_of(study, one)
    assert not is_rerun_of(two, one)   # other arms
    # another definition (tokens, a long pair of another length), more seeds or a record made before the
    # study are no reruns; nor is the study written again from its own runs (the same run ids)
    later = "2026-01-02T00:00:00Z"
    assert not is_rerun_of(_record(later, arms=("samu",), tokens=10**6, run="d"), study)
    assert not is_rerun_of(_record(later, arms=("samu",), long_seq_len=4096, run="d"), study)
    assert is_rerun_of(_record(later, arms=("samu",), run="d"), study)
    assert not is_rerun_of(_record(later, seeds=3, run="d"), study)
    assert not is_rerun_of(_record("2025-12-31T00:00:00Z", arms=("samu",), run="d"), study)
    assert not is_rerun_of({**study, "created": later}, study)
    # ... also where runs were logged without ids: the same validation curve is the same run
    no_ids = [{k: v for k, v in r.items() if k != "run_id"} for r in study["runs"]]
    assert not is_rerun_of({**study, "created": later, "runs": no_ids}, {**study, "runs": no_ids})
    # judged on the mean against the study's mean ± half-range, the edge included
    assert [(r["arm"], r["within"]) for r in rerun_rows(one, study)] == [("samu", False)]   # 0.012 > 0.01
    assert [(r["arm"], r["within"]) for r in rerun_rows(two, study)] == [("rglru", True), ("transformer", None)]
    edge = _record(later, arms=("samu",), bits={"samu": (1.75, None)}, run="e")
    assert rerun_rows(edge, _record("2026-01-01T00:00:00Z", bits={"samu": (1.5, 0.25)}))[0]["within"]
    # a rerun of a study and of an earlier rerun of it belongs to the study
    again = _record("2026-01-04T00:00:00Z", arms=("samu",), seeds=1, long_seq_len=0, bits={"samu": (1.305, None)},
                    run="f")
    assert is_rerun_of(again, one) and study_of(again, [study, one, two, again]) is study

    folder = tmp_path / "compare"
    folder.mkdir()
    for name, record in (("a", study), ("b", one), ("c", two), ("d", again)):
        (folder / f"{name}.json").write_text(json.dumps(record))
    lines, _ = compare_section(tmp_path, None)
    text = "\n".join(lines)
    assert text.count("### small preset") == 1 and "Reruns of this study" in text
    assert "| [b.json](compare/b.json) | samu | 2048 | 0 | 1.3120 | 1.3000 ± 0.0100 | no |" in text
    assert "| [c.json](compare/c.json) | rglru | 2048 | 0, 1 | 1.2519 ± 0.0010 | 1.2500 ± 0.0020 | yes |" in text
    assert "| [c.json](compare/c.json) | transformer | 2048 | 0, 1 | 1.4100 ± 0.0000 | 1.4000 | — |" in text
    assert text.count("[d.json](compare/d.json)") == 1
