"""The bench runner's output check (each candidate's y against the dispatched op's) and its records."""

import json

import pytest
import torch

from samu.bench import runner
from samu.bench.runner import _agreement, agreement_threshold, run_bench
from samu.bench.scopes import Candidate
from samu.gates.rules import load_rules


def test_agreement_threshold_is_twice_the_low_precision_rule_at_the_unit_roundoff():
    rules = load_rules()
    for dtype, u in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)):
        r = rules.low_factor * u + rules.low_floor
        assert agreement_threshold(dtype) == pytest.approx(2 * r / (1 - r))
    # fp32 has no low-precision rule: bf16's bound, which flags only gross disagreement
    assert agreement_threshold(torch.float32) == agreement_threshold(torch.bfloat16)


def _candidate(impl, y, dx=None):
    return Candidate(f"rglru/{impl}", "rglru", impl, impl != "auto", lambda: None, 0,
                     output=lambda: {"y": y} if dx is None else {"y": y, "dx": dx})


def test_a_candidate_off_samus_output_is_flagged():
    y = torch.randn(2, 64, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    near = (y.float() * (1 + 1e-3)).to(torch.bfloat16)
    nan = torch.full_like(y, float("nan"))
    found = _agreement([_candidate("auto", y), _candidate("near", near), _candidate("off", 1.05 * y),
                        _candidate("nan", nan)], torch.bfloat16)
    limit = agreement_threshold(torch.bfloat16)
    assert found["rglru/near"]["flagged"] is False and found["rglru/near"]["rel_error"] < limit
    assert found["rglru/off"] == {"against": "rglru/auto", "rel_error": pytest.approx(0.05, rel=0.05),
                                  "threshold": limit, "flagged": True,
                                  "rel_errors": {"y": pytest.approx(0.05, rel=0.05)}}
    assert found["rglru/nan"]["flagged"] is True and found["rglru/nan"]["rel_error"] is None
    assert "rglru/auto" not in found
    # with a backward, a peer whose y agrees but whose dx does not is flagged too
    found = _agreement([_candidate("auto", y, y), _candidate("bad_dx", y, 1.05 * y)], torch.bfloat16)
    assert found["rglru/bad_dx"]["flagged"] is True and found["rglru/bad_dx"]["rel_errors"]["y"] == 0


def test_the_record_is_on_disk_before_the_first_unit_and_after_every_unit(tmp_path, monkeypatch):
    out = tmp_path / "gen.json"
    on_disk = []
    end_unit = runner.end_unit

    def spy(record, path, device):
        end_unit(record, path, device)
        on_disk.append(len(json.loads(out.read_text())["rows"]))

    monkeypatch.setattr(runner, "end_unit", spy)
    record = run_bench(["gen"], [(1, 2, 128), (2, 2, 128), (1, 2, 64)], torch.float32, "cpu", preset="tiny",
                       progress=False, out=out)
    # one SAMU and one RG-LRU row per unit; the unit with the wrong width has none but is written too
    assert on_disk == [2, 4, 4] and len(record["skipped"]) == 2

    def stop(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "_candidates", stop)
    # another run never overwrites this one's record
    with pytest.raises(FileExistsError, match="not this run's record"):
        run_bench(["gen"], [(1, 2, 128)], torch.float32, "cpu", preset="tiny", progress=False, out=out)
    assert json.loads(out.read_text())["run_id"] == record["run_id"]
    out = tmp_path / "stopped.json"
    with pytest.raises(KeyboardInterrupt):
        run_bench(["gen"], [(1, 2, 128)], torch.float32, "cpu", preset="tiny", progress=False, out=out)
    stopped = json.loads(out.read_text())
    assert stopped["complete"] is False and stopped["rows"] == []


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """Bench records made at one clean commit (a resumed run's must match), whatever the checkout's state; the runs'
    locks under tmp_path."""
    here = runner.environment("cpu")
    monkeypatch.setattr(runner, "environment", lambda device: dict(here, git_commit="1" * 40, git_dirty=False))
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))


SHAPES = [(1, 9, 4), (1, 17, 4), (2, 5, 4)]


def _stop(*args):
    raise KeyboardInterrupt


def _cut_before_its_first_unit(out, shapes, monkeypatch):
    """A run of the fwd scope at ``shapes`` into ``out``, stopped (a timeout's SIGINT) as its first unit starts."""
    with monkeypatch.context() as m:
        m.setattr(runner, "_candidates", _stop)
        with pytest.raises(KeyboardInterrupt):
            run_bench(["fwd"], shapes, torch.float32, "cpu", impls=["torch"], with_peers=False, progress=False,
                      out=out)


def test_a_run_cut_short_is_resumed_in_its_own_record_without_timing_its_units_again(committed, tmp_path,
                                                                                       monkeypatch):
    from samu.bench.cli import main

    out, timed = tmp_path / "bench.json", []
    real = runner._candidates

    def cut_at_the_third(scope, shape, *args):
        # the run is stopped (a timeout's SIGINT) as its third unit starts
        if len(timed) == 2:
            raise KeyboardInterrupt
        timed.append((scope, shape, args[-2]))
        return real(scope, shape, *args)

    monkeypatch.setattr(runner, "_candidates", cut_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_bench(["fwd", "fb"], SHAPES, torch.float32, "cpu", impls=["torch"], with_peers=False, seed=5,
                  progress=False, out=out)
    cut = json.loads(out.read_text())
    assert not cut["complete"] and cut["units_done"] == [["fwd", [1, 9, 4]], ["fb", [1, 9, 4]]]
    assert cut["arguments"]["seed"] == 5 and cut["arguments"]["peers"] is False and len(cut["rows"]) == 4

    def counting(scope, shape, *args):
        timed.append((scope, shape, args[-2]))
        return real(scope, shape, *args)

    monkeypatch.setattr(runner, "_candidates", counting)
    timed.clear()
    # the run's own arguments (its seed, scopes, impls and no peers) from its record, not the command line's defaults
    assert main(["bench", "--device", "cpu", "--quiet", "--resume", str(out)]) == 0
    done = json.loads(out.read_text())
    assert done["complete"] and timed == [(scope, shape, 5) for shape in SHAPES[1:] for scope in ("fwd", "fb")]
    assert done["rows"][:4] == cut["rows"] and len(done["rows"]) == 12
    assert {r["candidate"] for r in done["rows"]} == {"samu/torch", "rglru/torch"}
    assert (done["run_id"], done["created"], done["copy_bandwidth"]) == (cut["run_id"], cut["created"],
                                                                          cut["copy_bandwidth"])
    assert len(done["resumed"]) == 1 and "copy_bandwidth" in done["resumed"][0]
    assert list(tmp_path.glob("*.json")) == [out]


def test_only_the_record_of_an_unfinished_bench_run_of_this_code_and_machine_can_be_resumed(committed, tmp_path,
                                                                                             monkeypatch):
    from samu.bench.cli import main
    from samu.bench.records import run_lock
    from samu.paths import FileLock

    out = tmp_path / "bench.json"
    record = run_bench(["fwd"], SHAPES[:1], torch.float32, "cpu", impls=["torch"], with_peers=False, progress=False,
                       out=out)
    assert json.loads(out.read_text())["complete"]

    def refused(match, rec=None, path=out):
        if rec is not None:
            path.write_text(json.dumps(rec))
        with pytest.raises(ValueError, match=match):
            runner.resumable_record(path, "cpu", "samu bench")

    refused("that run finished")
    cut = dict(record, complete=False)
    refused("not a bench record", {"kind": "gate"})
    refused("not a well-formed bench record", {k: v for k, v in cut.items() if k != "env"})
    refused("failed is not a list", dict(cut, failed=None))
    refused("made before --resume", {k: v for k, v in cut.items() if k != "units_done"})
    refused("git_commit", dict(cut, env=dict(cut["env"], git_commit="0" * 40)))
    refused("uncommitted code", dict(cut, env=dict(cut["env"], git_dirty=True)))
    with monkeypatch.context() as m:
        # no .git here and there: "unknown" == "unknown" must not pass for the same code
        unknown = dict(cut["env"], git_commit="unknown", git_dirty=None)
        m.setattr(runner, "environment", lambda device: unknown)
        refused("commit is unknown", dict(cut, env=unknown))
    refused("cannot be read", path=tmp_path / "missing.json")
    # what the run is taken up from must read back, in one line naming --resume
    for key, value in [("preset", None), ("dtype", "bogus"), ("scopes", ["nope"]), ("impls", 5), ("peers", 7),
                       ("warmup", "x"), ("samples", None), ("shapes", [[1, "a", 4]]), ("check_finite", 1)]:
        refused(f"{key} cannot be read back", dict(cut, arguments=dict(cut["arguments"], **{key: value})))
    refused("units_done cannot be read back", dict(cut, units_done=[["fwd"]]))
    refused("copy_bandwidth cannot be read back", {k: v for k, v in cut.items() if k != "copy_bandwidth"})
    refused("copy_bandwidth cannot be read back", dict(cut, copy_bandwidth={"bytes_per_s": True}))
    refused("resumed is not a list", dict(cut, resumed={}))
    out.write_text(json.dumps(cut))
    with FileLock(run_lock(cut)):
        refused("its run is still going")
    assert runner.resumable_record(out, "cpu", "samu bench")["resumed"][0]["command"] == "samu bench"
    # options that choose what is timed, or where it goes, are the record's own (argparse's prefixes included)
    for extra in (["--scopes", "fb"], ["--out", str(tmp_path / "x.json")], ["--seed=3"], ["--check-finite"]):
        with pytest.raises(SystemExit, match=f"drop {extra[0].split('=')[0]}"):
            main(["bench", "--device", "cpu", "--resume", str(out), *extra])
    # no abbreviation slips past by a name the check does not know (argparse's usage error, exit status 2)
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--device", "cpu", "--resume", str(out), "--sam", "5"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit, match="a bench record is a .json file"):
        main(["bench", "--device", "cpu", "--resume", str(tmp_path)])
    with pytest.raises(SystemExit, match="samu bench: error: --resume .*that run finished"):
        out.write_text(json.dumps(record))
        main(["bench", "--device", "cpu", "--resume", str(out)])


def test_a_unit_cut_midway_is_absent_from_the_record_and_timed_whole_when_resumed(committed, tmp_path, monkeypatch):
    out, profiled = tmp_path / "bench.json", []
    real = runner.peak_memory

    def cut_in_the_second_unit(fn, device):
        # stopped after the second unit's first row was made, before the unit is written
        profiled.append(1)
        if len(profiled) == 3:
            raise KeyboardInterrupt
        return real(fn, device)

    monkeypatch.setattr(runner, "peak_memory", cut_in_the_second_unit)
    with pytest.raises(KeyboardInterrupt):
        run_bench(["fwd"], SHAPES[:2], torch.float32, "cpu", impls=["torch"], with_peers=False, progress=False,
                  out=out)
    cut = json.loads(out.read_text())
    assert cut["units_done"] == [["fwd", [1, 9, 4]]] and [r["shape"] for r in cut["rows"]] == [[1, 9, 4]] * 2
    monkeypatch.setattr(runner, "peak_memory", real)
    done = run_bench([], [], torch.float32, "cpu", progress=False, out=out,
                     resume=runner.resumable_record(out, "cpu", "samu bench --resume"))
    assert [(r["shape"], r["candidate"]) for r in done["rows"]] == [
        (list(shape), name) for shape in SHAPES[:2] for name in ("samu/torch", "rglru/torch")]


def test_two_resumptions_of_one_record_the_later_is_refused(committed, tmp_path, monkeypatch):
    from samu.bench.records import ResumeRefused

    out = tmp_path / "bench.json"
    _cut_before_its_first_unit(out, SHAPES[:2], monkeypatch)
    # both read the record before either goes on: the first finishes it, the second would time it all again
    first = runner.resumable_record(out, "cpu", "first")
    second = runner.resumable_record(out, "cpu", "second")
    assert run_bench([], [], torch.float32, "cpu", progress=False, out=out, resume=first)["complete"]
    with pytest.raises(ResumeRefused, match="another run went on with the record since it was read"):
        run_bench([], [], torch.float32, "cpu", progress=False, out=out, resume=second)
    kept = json.loads(out.read_text())
    assert kept["complete"] and [r["command"] for r in kept["resumed"]] == ["first"] and len(kept["rows"]) == 4


def test_a_resumption_that_went_no_further_still_keeps_its_note_from_a_later_one(committed, tmp_path, monkeypatch):
    from samu.bench.records import ResumeRefused

    out = tmp_path / "bench.json"
    _cut_before_its_first_unit(out, SHAPES[:1], monkeypatch)
    monkeypatch.setattr(runner, "_candidates", _stop)
    first = runner.resumable_record(out, "cpu", "first")
    second = runner.resumable_record(out, "cpu", "second")
    # the first resumption writes its note and is cut before its first unit: no unit or row more than before
    with pytest.raises(KeyboardInterrupt):
        run_bench([], [], torch.float32, "cpu", progress=False, out=out, resume=first)
    with pytest.raises(ResumeRefused, match="another run went on"):
        run_bench([], [], torch.float32, "cpu", progress=False, out=out, resume=second)
    assert [r["command"] for r in json.loads(out.read_text())["resumed"]] == ["first"]
