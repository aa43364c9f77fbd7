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
