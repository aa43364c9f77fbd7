import json
from pathlib import Path

import pytest
import torch

from samu.bench.records import write_record
from samu.gates import reload
from samu.gates.runner import quantities, run_gates, status_from_records, update_status
from samu.ops import dispatch
from samu.ops.samu.torch import samu_mixer_torch

SHAPE = (1, 33, 8)
CLASS = dispatch.shape_class(33, 8, torch.float32)


def _good(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound):
    return samu_mixer_torch(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound)


def _bad(*args):
    # a 0.1% output scale error: far above every threshold, as a wrong parenthesisation might be
    y, h = _good(*args)
    return y * 1.001, h


def _crash(*args):
    raise RuntimeError("kernel launch failed")


class _OffWithoutDh(torch.autograd.Function):
    """(y, h) unchanged; y's cotangent 0.1% off when no cotangent reaches h (a form compiled apart gone wrong)."""

    @staticmethod
    def forward(ctx, y, h):
        ctx.set_materialize_grads(False)
        return y.clone(), h.clone()

    @staticmethod
    def backward(ctx, dy, dh):
        return (dy * 1.001 if dh is None else dy), dh


def _bad_without_dh(*args):
    return _OffWithoutDh.apply(*_good(*args))


def _bad_without_state(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound):
    # right from an initial state, 0.1% off without one (the form training calls, compiled apart)
    y, h = _good(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound)
    return (y if initial_state is not None else y * 1.001), h


@pytest.fixture
def dummy_variants(tmp_path, monkeypatch):
    """Three registered SAMU variants ranked bad < crash < good, and a private status file."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SAMU_GATE_STATUS", str(tmp_path / "status.json"))
    dispatch.variants("samu")
    names = {"test_gate_bad": (_bad, -3e9), "test_gate_crash": (_crash, -2.5e9), "test_gate_good": (_good, -2e9),
             "test_gate_bad_without_dh": (_bad_without_dh, -3.5e9),
             "test_gate_bad_without_state": (_bad_without_state, -3.6e9)}
    for name, (run, score) in names.items():
        dispatch.register(dispatch.Variant("samu", name, run, lambda B, L, D, H, s=score: s,
                                           lambda B, L, D: ("0", 0), "test dummy",
                                           settings=lambda B, L, D, H, dtype: f"tile {min(L, 8)}"))
    reload()
    yield list(names)
    for name in names:
        dispatch._VARIANTS["samu"].pop(name, None)
    reload()


def test_failing_variant_is_recorded_and_never_dispatched_for_its_shape_class(dummy_variants, tmp_path):
    with pytest.raises(ValueError, match="passed its gate"):
        dispatch.choose("samu", *SHAPE, torch.float32, "cpu", "triton")
    record = run_gates(["samu"], [SHAPE], [torch.float32], dummy_variants, "cpu", progress=False)
    rows = {r["backend"]: r for r in record["rows"]}
    assert rows["test_gate_good"]["pass"] and all(rows["test_gate_good"]["passed"].values())
    bad = rows["test_gate_bad"]
    assert not bad["pass"] and not bad["passed"]["y"] and bad["passed"]["final_state"]
    assert bad["errors"]["y"] == pytest.approx(1e-3, rel=1e-3)
    assert set(bad["thresholds"]) == set(quantities("samu", all_forms=True))
    # a backward right with the final state's cotangent and wrong without one fails, on that call's gradients only
    partly = rows["test_gate_bad_without_dh"]
    wrong = {q for q, ok in partly["passed"].items() if not ok}
    assert not partly["pass"] and all(q.endswith(("|no_final", "|no_state")) for q in wrong)
    assert {"dx|no_final", "dx|no_state"} <= wrong and not {"y|no_final", "y|no_state"} & wrong
    # a call right from an initial state and wrong without one fails on that call's results only
    stateless = rows["test_gate_bad_without_state"]
    wrong = {q for q, ok in stateless["passed"].items() if not ok}
    assert not stateless["pass"] and {"y|no_state", "dx|no_state"} <= wrong
    assert all(q.endswith("|no_state") for q in wrong)
    crash = rows["test_gate_crash"]
    # an exception row carries what status_from_records reads, so it blocks its class below
    assert crash["exception"] == "RuntimeError: kernel launch failed"
    assert crash["pass"] is False and crash["passed"] == {}
    assert (crash["op"], crash["variant"], crash["shape_class"], crash["shape"]) == (
        "samu", "test_gate_crash", CLASS, list(SHAPE))

    path = write_record(record, tmp_path / "results" / "gates")
    status_path, status = update_status(tmp_path / "results")
    assert status_path == tmp_path / "status.json"
    (status,) = status["by_platform"].values()   # one section: the platform of the CPU, where it ran
    assert ["samu", "test_gate_bad", CLASS] in status["blocked"]
    assert ["samu", "test_gate_bad_without_dh", CLASS] in status["blocked"]
    assert ["samu", "test_gate_bad_without_state", CLASS] in status["blocked"]
    assert ["samu", "test_gate_crash", CLASS] in status["blocked"]
    assert ["samu", "test_gate_good", CLASS] in status["passed"]
    assert status["sources"] == [f"gates/{path.name}"]
    # dispatch now picks the variant that passed in this class, and none in a class never gated
    assert dispatch.choose("samu", *SHAPE, torch.float32, "cpu", "triton").name == "test_gate_good"
    # explain names the choice and the launch settings it uses at that shape
    text = dispatch.explain(SHAPE, "samu", torch.float32, "cpu", "triton")
    assert "test_gate_good" in text and f"launch settings: tile {min(SHAPE[1], 8)}" in text
    with pytest.raises(ValueError, match="passed its gate"):
        dispatch.choose("samu", 1, 9000, 8, torch.float32, "cpu", "triton")
    # an explicit request still reaches the failing variant, so it can be gated again
    assert dispatch.choose("samu", *SHAPE, torch.float32, "cpu", "test_gate_bad").name == "test_gate_bad"


def test_a_finished_run_leaves_its_record_file_complete(tmp_path):
    # the file rewritten after each unit says complete once the last unit is done, as the returned record does
    out = tmp_path / "gates.json"
    record = run_gates(["samu"], [(1, 9, 4)], [torch.float32], ["torch"], "cpu", progress=False, out=out)
    saved = json.loads(out.read_text())
    assert record["complete"] and saved["complete"] and saved["rows"] == record["rows"]


@pytest.fixture
def committed(tmp_path, monkeypatch):
    """Gate records made at one clean commit (a resumed run's must match), whatever the checkout's state; the
    runs' locks under tmp_path."""
    from samu.gates import runner

    here = runner.environment("cpu")
    monkeypatch.setattr(runner, "environment", lambda device: dict(here, git_commit="1" * 40, git_dirty=False))
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))


def test_a_run_cut_short_is_resumed_in_its_own_record_without_gating_its_units_again(committed, tmp_path,
                                                                                       monkeypatch):
    from samu.bench.cli import main
    from samu.gates import runner

    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    shapes, out = [(1, 9, 4), (1, 17, 4), (2, 5, 4)], tmp_path / "gates.json"
    real, gated = runner.gate_unit, []

    def cut_at_the_second(**unit):
        # the run is stopped (a timeout's SIGINT) as its second unit starts
        if len(gated) == 1:
            raise KeyboardInterrupt
        gated.append(unit["shape"])
        yield from real(**unit)

    monkeypatch.setattr(runner, "gate_unit", cut_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_gates(["samu"], shapes, [torch.float32], ["torch"], "cpu", progress=False, out=out, seed=5)
    cut = json.loads(out.read_text())
    assert not cut["complete"] and [r["shape"] for r in cut["rows"]] == [[1, 9, 4]]
    assert cut["units_done"] == [["samu", [1, 9, 4], "float32"]] and cut["arguments"]["seed"] == 5

    def counting(**unit):
        gated.append((unit["shape"], unit["done"], unit["seed"]))
        yield from real(**unit)

    monkeypatch.setattr(runner, "gate_unit", counting)
    gated.clear()
    # the run's own arguments (its seed too) from its record, not the command line's defaults
    assert main(["gate", "--device", "cpu", "--quiet", "--no-status", "--resume", str(out)]) == 0
    done = json.loads(out.read_text())
    assert done["complete"] and gated == [((1, 17, 4), (), 5), ((2, 5, 4), (), 5)]
    assert done["rows"][0] == cut["rows"][0] and [r["shape"] for r in done["rows"]] == [list(s) for s in shapes]
    assert (done["run_id"], done["created"]) == (cut["run_id"], cut["created"]) and len(done["resumed"]) == 1
    assert list(tmp_path.glob("*.json")) == [out]


def test_a_unit_cut_between_backends_is_resumed_with_the_backends_it_lacks(committed, dummy_variants, tmp_path,
                                                                           monkeypatch):
    from samu.gates import runner
    from samu.gates.runner import resumable_record

    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "gates.json"
    with monkeypatch.context() as m:
        m.setattr(runner, "_context_lost", lambda device: "RuntimeError: CUDA error: an illegal memory access")
        with pytest.raises(RuntimeError, match="CUDA context is lost"):
            run_gates(["samu"], [SHAPE], [torch.float32], ["test_gate_crash", "test_gate_good"], "cpu",
                      progress=False, out=out)
    record = run_gates(["samu"], [], [], [], "cpu", progress=False, out=out,
                       resume=resumable_record(out, "cpu", "samu gate --resume"))
    assert record["complete"] and [r["backend"] for r in record["rows"]] == ["test_gate_crash", "test_gate_good"]


def test_a_resumed_worker_gates_only_the_backends_a_unit_lacks(committed, tmp_path, monkeypatch):
    from samu.gates.runner import resumable_record

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out, backends = tmp_path / "gates.json", ["test_gate_fine", "torch"]
    whole = run_gates(["samu"], [SHAPE], [torch.float32], backends, "cpu", progress=False, out=out, isolate=True,
                      preload=["tests.gates.faulty_variants"])
    # as a worker cut off after its first backend would have left it
    out.write_text(json.dumps(dict(whole, rows=whole["rows"][:1], units_done=[], complete=False)))
    record = run_gates(["samu"], [], [], [], "cpu", progress=False, out=out, isolate=True,
                       preload=["tests.gates.faulty_variants"], resume=resumable_record(out, "cpu", "resume"))
    assert record["complete"] and [r["backend"] for r in record["rows"]] == backends
    assert record["rows"][0] == json.loads(json.dumps(whole["rows"][0]))


def test_only_the_record_of_an_unfinished_run_of_this_code_and_machine_can_be_resumed(committed, tmp_path,
                                                                                       monkeypatch):
    from samu.bench.cli import main
    from samu.bench.records import run_lock
    from samu.gates import runner
    from samu.gates.runner import resumable_record
    from samu.paths import FileLock

    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "gates.json"
    record = run_gates(["samu"], [(1, 9, 4)], [torch.float32], ["torch"], "cpu", progress=False, out=out)

    def refused(match, rec=None, path=out):
        if rec is not None:
            path.write_text(json.dumps(rec))
        with pytest.raises(ValueError, match=match):
            resumable_record(path, "cpu", "samu gate")

    refused("that run finished")
    cut = dict(record, complete=False)
    refused("not a gate record", {"kind": "bench"})
    refused("not a well-formed gate record", {k: v for k, v in cut.items() if k != "env"})
    refused("made before --resume", {k: v for k, v in cut.items() if k != "arguments"})
    refused("git_commit", dict(cut, env=dict(cut["env"], git_commit="0" * 40)))
    refused("uncommitted code", dict(cut, env=dict(cut["env"], git_dirty=True)))
    refused("gates.toml version", dict(cut, gates_version=-1))
    for key, value in [("dtypes", ["x"]), ("backends", 5), ("seed", "x"), ("heads", "x"), ("documents", "x"),
                       ("shapes", [[1, "a", 4]]), ("ops", ["mamba"])]:
        refused(f"{key} cannot be read back", dict(cut, arguments=dict(cut["arguments"], **{key: value})))
    refused("units_done cannot be read back", dict(cut, units_done=[["samu"]]))
    with monkeypatch.context() as m:
        # no .git here and there: "unknown" == "unknown" must not pass for the same code
        unknown = dict(cut["env"], git_commit="unknown", git_dirty=None)
        m.setattr(runner, "environment", lambda device: unknown)
        refused("commit is unknown", dict(cut, env=unknown))
    refused("cannot be read", path=tmp_path / "missing.json")
    out.write_text(json.dumps(cut))
    with FileLock(run_lock(cut)):
        refused("its run is still going")
    assert resumable_record(out, "cpu", "samu gate")["resumed"][0]["command"] == "samu gate"
    for extra in (["--ops", "samu"], ["--out", str(tmp_path / "x.json")], ["--seed=3"], ["--status-only"]):
        with pytest.raises(SystemExit, match=f"drop {extra[0].split('=')[0]}"):
            main(["gate", "--device", "cpu", "--no-status", "--resume", str(out), *extra])
    # no abbreviation slips past by a name the check does not know
    with pytest.raises(SystemExit) as exited:
        main(["gate", "--device", "cpu", "--no-status", "--resume", str(out), "--dtyp", "fp32"])
    assert exited.value.code == 2
    # --status says where a status goes, not what is gated: it may stand beside --resume
    assert main(["gate", "--device", "cpu", "--quiet", "--no-status", "--status", str(tmp_path / "s.json"),
                 "--resume", str(out)]) == 0
    assert json.loads(out.read_text())["complete"]
    with pytest.raises(SystemExit, match="a gate record is a .json file"):
        main(["gate", "--device", "cpu", "--no-status", "--resume", str(tmp_path)])


def test_a_gate_record_another_resumption_went_on_with_is_refused_in_one_line(committed, tmp_path, monkeypatch):
    from samu.bench.cli import main
    from samu.gates import runner
    from samu.gates.runner import resumable_record

    out, real, gated = tmp_path / "gates.json", runner.gate_unit, []

    def cut_at_the_second(**unit):
        if gated:
            raise KeyboardInterrupt
        gated.append(unit["shape"])
        yield from real(**unit)

    monkeypatch.setattr(runner, "gate_unit", cut_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run_gates(["samu"], [(1, 9, 4), (1, 17, 4)], [torch.float32], ["torch"], "cpu", progress=False, out=out)
    monkeypatch.setattr(runner, "gate_unit", real)
    stale = resumable_record(out, "cpu", "samu gate --resume")
    # another resumption finishes the record between this one's reading and its start
    assert main(["gate", "--device", "cpu", "--quiet", "--no-status", "--resume", str(out)]) == 0
    with pytest.raises(runner.ResumeRefused, match="another run went on with the record since it was read"):
        run_gates([], [], [], [], "cpu", progress=False, out=out, resume=stale)
    with pytest.raises(SystemExit, match="samu gate: error: --resume .*that run finished"):
        main(["gate", "--device", "cpu", "--quiet", "--no-status", "--resume", str(out)])


def test_a_resumed_run_brings_its_copy_in_the_users_records_up_to_date(tmp_path, monkeypatch):
    from samu.gates.runner import _into_user_records
    from samu.ops import gate_status

    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    record = run_gates(["samu"], [(1, 9, 4), (1, 17, 4)], [torch.float32], ["torch"], "cpu", progress=False)
    _into_user_records([("cut.json", dict(record, rows=record["rows"][:1], complete=False))])
    _into_user_records([("done.json", record)])
    (copy,) = gate_status.user_records().glob("*.json")
    assert json.loads(copy.read_text())["rows"] == json.loads(json.dumps(record["rows"]))


def test_torch_backend_passes_its_gates_for_both_mixers_and_dtypes():
    record = run_gates(["samu", "rglru"], [(2, 37, 10)], [torch.float32, torch.bfloat16], ["torch"], "cpu",
                       progress=False)
    assert record["complete"] and len(record["rows"]) == 4
    for row in record["rows"]:
        assert row["pass"], row
        assert set(row["errors"]) == set(quantities(row["op"], all_forms=True))
        low = row["dtype"] == "bfloat16"
        assert row["rules"]["y"] == row["rules"]["y|no_final"] == row["rules"]["dx|no_final"] == (
            row["rules"]["y|no_state"]) == row["rules"]["dx|no_state"] == ("low_precision" if low else "fp32")
        assert row["rules"]["d_initial_state"] == row["rules"]["d_initial_state|no_final"] == "fp32"
        rounded = {"y", "dx", "y|no_final", "dx|no_final", "y|no_state", "dx|no_state"} if low else set()
        assert set(row["baselines"]["rounded_float64"]) == rounded


def _packing(scale):
    """A packing dummy: the torch path one sequence at a time, its y scaled (0.1% off: far above the fp32 rule)."""
    import samu

    def run(x, nu, theta_log, directions, amplitudes, initial_state, radial_bound, cu_seqlens=None):
        y, h = samu.samu_mixer(x, nu, theta_log, directions, amplitudes, initial_state=initial_state,
                               output_final_state=True, radial_bound=radial_bound, backend="torch",
                               cu_seqlens=None if cu_seqlens is None else cu_seqlens.tolist())
        return y * scale, h
    return run


def test_packed_gates_judge_each_sequence_against_its_own_reference(dummy_variants):
    from samu.gates.inputs import document_offsets

    offsets = document_offsets(61, 5, seed=3)
    assert offsets[:2] == [0, 1] and offsets[-1] == 61 and len(offsets) == 6 and offsets == sorted(set(offsets))
    assert document_offsets(61, 5, seed=3) == offsets and document_offsets(7, 1, seed=0) == [0, 7]
    with pytest.raises(ValueError, match="documents must lie in"):
        document_offsets(4, 5, seed=0)
    packing = {"test_pack_good": 1.0, "test_pack_bad": 1.001}
    for name, scale in packing.items():
        dispatch.register(dispatch.Variant("samu", name, _packing(scale), lambda B, L, D, H: 0.0,
                                           lambda B, L, D: ("0", 0), "test dummy", packs=True))
    try:
        record = run_gates(["samu", "rglru"], [(1, 61, 8), (2, 61, 8)], [torch.float32, torch.bfloat16],
                           ["torch", "test_gate_good", *packing], "cpu", progress=False, documents=5)
    finally:
        for name in packing:
            dispatch._VARIANTS["samu"].pop(name, None)
    assert {"op": "samu", "backend": "*", "reason": "documents=5 packs a batch-1 shape of L >= 5, got (2, 61, 8)"} \
        in record["skipped"]
    # a variant that does not pack runs one call per sequence: nothing for a packed gate to speak for
    assert any(e["backend"] == "test_gate_good" and "run one call per sequence" in e["reason"]
               for e in record["skipped"])
    rows = record["rows"]
    assert len(rows) == 2 * 2 + 2 * 2   # torch for both mixers, the packing dummies for SAMU; two dtypes
    for row in rows:
        assert row["documents"] == 5 and row["cu_seqlens"][:2] == [0, 1] and row["cu_seqlens"][-1] == 61
        # the bad dummy's 0.1% error hides under bf16's rounding, not under the fp32 rule
        assert row["pass"] == (row["backend"] != "test_pack_bad" or row["dtype"] == "bfloat16"), row
        assert set(row["errors"]) == set(quantities(row["op"], all_forms=True))
    # packed rows speak for packed classes only
    status = status_from_records([("r", {**record, "kind": "gate", "created": "x"})])
    packed = dispatch.shape_class(61, 8, torch.float32, packed=True)
    assert packed.endswith("|packed") and ["samu", "test_pack_bad", packed] in status["blocked"]
    assert all(cls.endswith("|packed") for _, _, cls in status["blocked"] + status["passed"])


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_a_packing_variant_gated_packed_passes_its_packed_class(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    variant = dispatch.variants("samu")["triton_grouped"]
    record = run_gates(["samu"], [(1, 45, 8)], [torch.float32], ["triton_grouped"], "cpu", progress=False,
                       documents=4)
    [row] = record["rows"]
    assert row["pass"], row
    cls = dispatch.gate_class(variant, 1, 45, 8, 16, torch.float32, packed=True)
    assert row["shape_class"] == cls and cls.endswith("|packed")
    status = status_from_records([("r", {**record, "kind": "gate", "created": "x"})])
    assert status["passed"] == [["samu", "triton_grouped", cls]] and not status["blocked"]


def test_a_state_crossing_a_boundary_fails_the_packed_gate(monkeypatch):
    from samu.ops import functional

    # outputs as if cu_seqlens were ignored (the state runs on from one sequence into the next), with the
    # right final states
    packed = functional._packed

    def leaking(op, backend, heads, native, run, x, h0, output_final_state, cu_seqlens):
        y, _ = packed(op, backend, heads, native, run, x, None if h0 is None else h0[:1], output_final_state,
                      [0, x.shape[1]])
        return y, packed(op, backend, heads, native, run, x, h0, output_final_state, cu_seqlens)[1]

    monkeypatch.setattr(functional, "_packed", leaking)
    record = run_gates(["samu"], [(1, 40, 8)], [torch.float32], ["torch"], "cpu", progress=False, documents=3)
    [row] = record["rows"]
    assert "exception" not in row and row["passed"]["final_state"]
    assert not row["pass"] and not row["passed"]["y"] and not row["passed"]["dx"]
    assert not row["passed"]["y|no_state"] and not row["passed"]["dx|no_state"]


def _gate_record(created, rows, version=1):
    return ("r", {"kind": "gate", "created": created, "rows": rows, "gates_version": version})


def _row(variant, ok, cls="c", shape=(1, 8, 4)):
    return {"op": "samu", "variant": variant, "shape_class": cls, "shape": list(shape), "pass": ok}


def test_status_follows_the_newest_row_per_variant_class_and_shape():
    old = _gate_record("2026-01-01T00:00:00Z", [_row("v", False), _row("w", True)])
    new = _gate_record("2026-01-02T00:00:00Z", [_row("v", True), _row("v", False, cls="d")])
    status = status_from_records([old, new])
    assert status["blocked"] == [["samu", "v", "d"]]
    assert status["passed"] == [["samu", "v", "c"], ["samu", "w", "c"]]
    # within one record any failing shape of the class blocks it
    mixed = _gate_record("2026-01-03T00:00:00Z", [_row("v", True), _row("v", False, shape=(1, 9, 4))])
    assert status_from_records([old, new, mixed])["blocked"] == [["samu", "v", "c"], ["samu", "v", "d"]]


def test_rows_older_than_a_variants_gated_since_are_left_out(monkeypatch):
    from samu.ops import dispatch

    variants = {"v": dispatch.Variant(op="samu", name="v", run=None, preference=None, scratch=None,
                                      gated_since="2026-01-02T00:00:00Z")}
    monkeypatch.setattr(dispatch, "variants", lambda op: variants if op == "samu" else {})
    monkeypatch.setattr(dispatch, "triton_available", lambda: True)
    old = _gate_record("2026-01-01T00:00:00Z", [_row("v", True), _row("v", False, cls="d"), _row("w", True)])
    new = _gate_record("2026-01-02T00:00:00Z", [_row("v", True, cls="e")])
    status = status_from_records([old, new])
    # v's passes and failures before its date say nothing about it; w (no date) keeps its row
    assert status["passed"] == [["samu", "v", "e"], ["samu", "w", "c"]] and status["blocked"] == []
    # a later date for the packed classes alone leaves out their older rows and no unpacked one
    variants["v"] = dispatch.Variant(op="samu", name="v", run=None, preference=None, scratch=None,
                                     gated_since="2026-01-01T00:00:00Z", packed_gated_since="2026-01-02T00:00:00Z")
    old = _gate_record("2026-01-01T00:00:00Z", [_row("v", True), _row("v", False, cls="c|packed")])
    new = _gate_record("2026-01-02T00:00:00Z", [_row("v", True, cls="d|packed")])
    status = status_from_records([old, new])
    assert status["passed"] == [["samu", "v", "c"], ["samu", "v", "d|packed"]] and status["blocked"] == []
    # and the later of the two dates rules a packed class
    variants["v"] = dispatch.Variant(op="samu", name="v", run=None, preference=None, scratch=None,
                                     gated_since="2026-01-03T00:00:00Z", packed_gated_since="2026-01-02T00:00:00Z")
    assert status_from_records([old, new])["passed"] == []


def test_each_platform_gets_its_own_section_from_its_own_records():
    h200 = dict(_gate_record("2026-01-01T00:00:00Z", [_row("v", False)])[1],
                env={"gpu": "NVIDIA H200", "triton": "9.9.0"})
    cpu = dict(_gate_record("2026-01-02T00:00:00Z", [_row("v", True)])[1], env={"gpu": None, "triton": "9.9.0"})
    # the newer pass on the CPU does not clear the H200's failure: a section holds its platform's rows only
    records = [("h200.json", h200), ("cpu.json", cpu)]
    assert status_from_records(records, platform="NVIDIA H200|triton 9.9")["blocked"] == [["samu", "v", "c"]]
    assert status_from_records(records, platform="cpu|triton 9.9")["passed"] == [["samu", "v", "c"]]
    assert status_from_records(records)["passed"] == [["samu", "v", "c"]]


def test_a_pass_at_another_shape_does_not_clear_a_failure():
    failed = _gate_record("2026-01-01T00:00:00Z", [_row("v", False, shape=(1, 8, 4))])
    other = _gate_record("2026-01-02T00:00:00Z", [_row("v", True, shape=(1, 9, 4))])
    assert status_from_records([failed, other])["blocked"] == [["samu", "v", "c"]]
    rerun = _gate_record("2026-01-03T00:00:00Z", [_row("v", True, shape=(1, 8, 4))])
    status = status_from_records([failed, other, rerun])
    assert status["blocked"] == [] and status["passed"] == [["samu", "v", "c"]]


def test_records_of_another_gates_version_are_left_out():
    stale = _gate_record("2026-01-02T00:00:00Z", [_row("v", False)], version=0)
    current = _gate_record("2026-01-01T00:00:00Z", [_row("v", True)], version=1)
    status = status_from_records([stale, current], version=1)
    assert status["blocked"] == [] and status["passed"] == [["samu", "v", "c"]]
    assert status_from_records([stale, current], version=0)["blocked"] == [["samu", "v", "c"]]


def test_quarantined_gate_records_never_reach_the_status(tmp_path):
    record = run_gates(["rglru"], [(1, 9, 4)], [torch.float32], ["torch"], "cpu", progress=False)
    write_record(record, tmp_path / "gates" / "ok.json")
    bad = json.loads(json.dumps(record))
    bad["created"] = "2099-01-01T00:00:00Z"
    bad["rows"][0]["pass"] = False
    write_record(bad, tmp_path / "quarantine" / "wrong.json")
    _, status = update_status(tmp_path, path=tmp_path / "status.json")
    (status,) = status["by_platform"].values()
    assert status["blocked"] == [] and status["sources"] == ["gates/ok.json"]
    reload()


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_the_packaged_status_is_what_the_committed_records_make(tmp_path):
    # samu/gates/status.json must be rebuilt (docs/measurement.md) in the commit that adds, moves or quarantines a
    # gate record, or changes a variant's gated_since
    root = Path(__file__).parents[2]
    path, _ = update_status(root / "results", path=tmp_path / "status.json")
    reload()
    assert path.read_text() == (root / "samu" / "gates" / "status.json").read_text(), (
        "samu/gates/status.json is stale: samu gate --status-only --status samu/gates/status.json")


def test_a_gate_speaks_only_for_the_numerics_it_ran_with(tmp_path, monkeypatch):
    """A variant whose group size follows L: passing at L = 33 does not clear L = 70, although both
    lengths fall in one length bucket, because the group size (its parenthesisation) differs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("SAMU_GATE_STATUS", str(tmp_path / "status.json"))
    dispatch.variants("samu")
    variant = dispatch.register(dispatch.Variant(
        "samu", "test_gate_groups", _good, lambda B, L, D, H: -4e9, lambda B, L, D: ("0", 0), "test dummy",
        numerics=lambda B, L, D, H, dtype: f"G={1 + L // 64}"))
    reload()
    try:
        record = run_gates(["samu"], [SHAPE], [torch.float32], ["test_gate_groups"], "cpu", progress=False)
        (row,) = record["rows"]
        assert row["pass"] and row["shape_class"] == dispatch.shape_class(33, 8, torch.float32, "G=1")
        write_record(record, tmp_path / "results" / "gates")
        update_status(tmp_path / "results")
        assert dispatch.choose("samu", 1, 40, 8, torch.float32, "cpu", "triton").variant is variant
        with pytest.raises(ValueError, match="passed its gate"):
            dispatch.choose("samu", 1, 70, 8, torch.float32, "cpu", "triton")
    finally:
        dispatch._VARIANTS["samu"].pop("test_gate_groups", None)
        reload()


def test_warm_up_runs_every_variant_unit_in_worker_processes(monkeypatch):
    """The warm-up compiles (here: interprets) each Triton variant's unit once in a pool of processes;
    the torch backend has no kernels to warm."""
    from samu.gates.runner import warm

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    done = warm(["samu"], [(1, 9, 4)], [torch.float32], ["torch", "variants"], "cpu", jobs=2, budget_s=240)
    assert sorted(item[1] for item, _, _ in done) == sorted(dispatch.variants("samu"))
    assert all(err is None for _, _, err in done), done


def test_warm_up_reports_units_left_when_the_budget_is_spent(monkeypatch):
    from samu.gates.runner import warm

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    done = warm(["samu"], [(1, 9, 4)], [torch.float32], ["variants"], "cpu", jobs=2, budget_s=0.0, progress=False)
    assert len(done) == len(dispatch.variants("samu"))
    assert all(err == "not compiled within the warm-up budget" for _, _, err in done)


def test_gates_run_with_the_head_count_asked_for():
    record = run_gates(["rglru"], [(1, 9, 8), (1, 9, 6)], [torch.float32], ["torch"], "cpu", progress=False, heads=4)
    (row,) = record["rows"]
    assert row["shape"] == [1, 9, 8] and row["heads"] == 4 and row["pass"]
    assert {"op": "rglru", "backend": "*", "reason": "heads=4 does not divide D=6"} in record["skipped"]


def test_a_worker_that_dies_or_loses_its_context_fails_that_row_and_the_run_goes_on(tmp_path, monkeypatch):
    """Isolated gates (the default on CUDA), here on CPU: at L = 33 one variant takes its worker down
    and the next raises an illegal-address error that leaves the context unusable; each becomes a failed
    row naming its error, a fresh worker gates the rest of the unit, and the next unit runs."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backends = ["test_gate_exit", "test_gate_sticky", "test_gate_fine", "torch"]
    record = run_gates(["samu"], [SHAPE, (1, 17, 8)], [torch.float32], backends, "cpu", progress=False,
                       out=tmp_path / "gates.json", isolate=True, preload=["tests.gates.faulty_variants"])
    assert record["complete"] and record["skipped"] == []
    rows = {(r["backend"], r["shape"][1]): r for r in record["rows"]}
    assert sorted(rows) == sorted((b, L) for b in backends for L in (33, 17))
    died, lost = rows["test_gate_exit", 33], rows["test_gate_sticky", 33]
    assert died["exception"] == "worker process died with exit code 3 while running test_gate_exit"
    assert lost["exception"] == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert not died["pass"] and not lost["pass"] and died["shape_class"] == CLASS
    assert all(r["pass"] for key, r in rows.items() if key not in {("test_gate_exit", 33), ("test_gate_sticky", 33)})
    assert json.loads((tmp_path / "gates.json").read_text())["rows"] == json.loads(json.dumps(record["rows"]))
    status = status_from_records([("gates.json", record)])
    assert ["samu", "test_gate_exit", CLASS] in status["blocked"]
    assert ["samu", "test_gate_sticky", CLASS] in status["blocked"]
    assert ["samu", "test_gate_fine", CLASS] in status["passed"]
    # the faulty variants (and their context probe) exist in the workers only
    assert "test_gate_exit" not in dispatch.variants("samu")


def test_in_process_gates_stop_at_a_lost_context_and_keep_its_row(dummy_variants, tmp_path, monkeypatch):
    from samu.gates import runner

    monkeypatch.setattr(runner, "_context_lost", lambda device: "RuntimeError: CUDA error: an illegal memory access")
    with pytest.raises(RuntimeError, match="CUDA context is lost"):
        run_gates(["samu"], [SHAPE], [torch.float32], ["test_gate_crash", "test_gate_good"], "cpu",
                  progress=False, out=tmp_path / "gates.json")
    (row,) = json.loads((tmp_path / "gates.json").read_text())["rows"]
    assert row["backend"] == "test_gate_crash" and row["exception"] == "RuntimeError: kernel launch failed"


def test_a_reference_out_of_memory_is_tried_again_then_recorded_as_a_skip(monkeypatch):
    from samu.gates import runner

    real, calls = runner.evaluate, []

    def short_of_memory(op, inputs, **kw):
        calls.append(kw.get("ref_dtype"))
        if len(calls) <= fails:
            raise torch.OutOfMemoryError("CUDA out of memory (a test stand-in)")
        return real(op, inputs, **kw)

    monkeypatch.setattr(runner, "evaluate", short_of_memory)
    monkeypatch.setattr(runner, "REFERENCE_RETRY_S", 0.0)
    fails = 2
    record = run_gates(["samu"], [(1, 9, 4)], [torch.float32], ["torch"], "cpu", progress=False)
    assert [r["pass"] for r in record["rows"]] == [True] and not record["skipped"]
    calls.clear()
    fails = runner.REFERENCE_ATTEMPTS
    record = run_gates(["samu"], [(1, 9, 4)], [torch.float32], ["torch"], "cpu", progress=False)
    assert not record["rows"] and "reference failed: OutOfMemoryError" in record["skipped"][0]["reason"]
    assert len(calls) == runner.REFERENCE_ATTEMPTS
