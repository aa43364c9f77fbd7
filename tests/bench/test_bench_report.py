"""Report rendering from fixture records: deterministic, newest record wins, quarantine never read.

The expected Markdown is ``fixtures/REPORT.md``; after an intended change of the report format,
regenerate it with ``SAMU_UPDATE_GOLDEN=1 pytest tests/bench/test_bench_report.py`` and review the diff.
"""

import json
import os
from pathlib import Path

import pytest

from samu.bench.records import SCHEMAS, load_records
from samu.bench.report import _sweeps, build_report, collect

GOLDEN = Path(__file__).with_name("fixtures") / "REPORT.md"
BANDWIDTH = 4.0e12
ENV = {"torch": "2.11.0+cu130", "triton": "3.6.0", "python": "3.12.3", "device": "cuda", "cuda": "13.0",
       "gpu": "NVIDIA H200", "gpu_memory": 150_000_000_000, "driver": "580.95", "cpu": "x86_64",
       "triton_interpret": False, "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False}


AUTO_CHOICE = {"samu": "samu_grouped_k32", "rglru": "triton_chunked"}
INFERENCE = ("gen", "prefill")


def bench_row(scope, op, impl, shape, ms, peer=False, **extra):
    B, L, D = shape
    floor = {"fwd": 2, "fb": 5, "packed": 5}.get(scope)
    floor_bytes = floor * B * L * D * 2 if floor else None
    floor_ms = floor_bytes / BANDWIDTH * 1e3 if floor else None
    return {"scope": scope, "op": op, "impl": impl, "candidate": f"{op}/{impl}", "peer": peer, "shape": list(shape),
            "dtype": "bfloat16", "order": 0, "median_ms": ms, "round_medians_ms": [ms, ms],
            "samples_ms": [[ms] * 5, [ms] * 5], "peak_alloc": int(ms * 2**20 * 10), "peak_reserved": int(ms * 2**20 * 12),
            "launches": {"kernels": 7, "memcpy": 1, "memset": 1, "total": 9}, "params": 3076 if op == "samu" else 134144,
            # as samu.bench.scopes records them: the variant dispatch chose, "step" for generation
            "choice": None if peer or scope == "prefill" else "step" if scope == "gen" else AUTO_CHOICE[op] if impl == "auto" else impl,
            "choice_reason": None if peer else "fixture",
            "scratch_formula": "12*B*D*ceil(L/32)" if op == "samu" and impl == "auto" and scope not in INFERENCE else None,
            "scratch_bytes": 12 * B * D * -(-L // 32) if op == "samu" and impl == "auto" and scope not in INFERENCE else None,
            "floor_formula": "fixture" if floor else None, "floor_bytes": floor_bytes, "floor_ms": floor_ms,
            "floor_ratio": ms / floor_ms if floor else None,
            "agreement": None if impl == "auto" else {"against": f"{op}/auto", "rel_error": 1.5e-6,
                                                      "threshold": 8.64e-3, "flagged": False}, **extra}


def record(kind, created, rows, **fields):
    return {"schema": SCHEMAS[kind], "kind": kind, "created": created, "command": f"samu {kind} --fixture",
            "env": ENV, "rows": rows, "complete": True, "skipped": [], "failed": [],
            **({"copy_bandwidth": {"bytes": 1 << 30, "median_ms": 0.5, "bytes_per_s": BANDWIDTH}} if kind == "bench" else {}),
            **fields}


def mixer_rows(shape, scale):
    rows = []
    for scope, f in (("fwd", 0.4), ("fb", 1.0)):
        rows += [bench_row(scope, "samu", "auto", shape, round(1.234 * scale * f, 4)),
                 bench_row(scope, "samu", "torch", shape, round(40.5 * scale * f, 4)),
                 bench_row(scope, "samu", "ascan-complex", shape, round(31.25 * scale * f, 4), peer=True),
                 bench_row(scope, "rglru", "auto", shape, round(2.468 * scale * f, 4)),
                 bench_row(scope, "rglru", "torch", shape, round(20.25 * scale * f, 4)),
                 # as the H200 measured it: y 4-15% off samu's, so flagged and never ranked
                 bench_row(scope, "rglru", "fla-chunk_hgrn", shape, round(30.5 * scale * f, 4), peer=True,
                           agreement={"against": "rglru/auto", "rel_error": 4.25e-2, "threshold": 8.64e-3,
                                      "flagged": True})]
    return rows


def gate_row(op, backend, shape, ok, worst_q="y"):
    qs = ["y", "final_state", "dx", "d_initial_state"] + (["d_nu", "d_theta_log", "d_directions", "d_amplitudes"]
                                                          if op == "samu" else ["d_w_a", "d_b_a", "d_w_x", "d_b_x", "d_a_param"])
    errors = {q: 1e-7 for q in qs}
    thresholds = {q: 2e-6 for q in qs}
    if not ok:
        errors[worst_q] = 6.25e-6
    passed = {q: errors[q] <= thresholds[q] for q in qs}
    return {"op": op, "backend": backend, "variant": backend, "shape": list(shape),
            "shape_class": "bfloat16|L<=8192|D<=1024", "dtype": "bfloat16", "seed": 7, "errors": errors,
            "baselines": {"serial_fp32": {q: 5e-7 for q in qs}, "rounded_float64": {"y": 1e-3, "dx": 1e-3}},
            "thresholds": thresholds, "rules": {q: "fp32" for q in qs}, "passed": passed, "pass": all(passed.values())}


def write_fixtures(root: Path):
    files = {
        "bench/2026-01-01-old.json": record("bench", "2026-01-01T00:00:00Z", [
            bench_row("fb", "samu", "auto", (1, 8192, 1024), 7.777),
            bench_row("fb", "rglru", "auto", (1, 8192, 1024), 8.888)]),
        "bench/2026-01-02-primary.json": record(
            "bench", "2026-01-02T00:00:00Z",
            mixer_rows((1, 8192, 1024), 1.0) + mixer_rows((4, 2048, 2048), 1.5) + mixer_rows((1, 16384, 1024), 2.0),
            skipped=[{"scope": "fb", "shape": [1, 8192, 1024], "candidate": "rglru/ascan-scalar",
                      "reason": "accelerated-scan is not installed"}],
            failed=[{"scope": "fwd", "shape": [4, 2048, 2048], "candidate": "samu/torch", "error": "OutOfMemoryError: x"}]),
        "bench/2026-01-03-modules.json": record("bench", "2026-01-03T00:00:00Z", [
            bench_row("block", "samu", "auto", (4, 2048, 2048), 3.5),
            bench_row("block", "rglru", "auto", (4, 2048, 2048), 3.75),
            bench_row("block", "samu", "compiled", (4, 2048, 2048), 3.25, mode="compiled"),
            bench_row("block", "samu", "gemm", (4, 2048, 2048), 2.5, mode="gemm"),
            bench_row("block", "rglru", "gemm", (4, 2048, 2048), 2.5, mode="gemm"),
            bench_row("step", "samu", "auto", (4, 2048, 2048), 9.5),
            bench_row("step", "rglru", "auto", (4, 2048, 2048), 9.75),
            bench_row("model", "samu", "auto", (4, 2048, 1664), 95.5, preset="400m"),
            bench_row("model", "rglru", "auto", (4, 2048, 1664), 99.25, preset="400m"),
            bench_row("model", "samu", "compiled", (4, 2048, 1664), 62.5, preset="400m", tokens_per_call=8192,
                      params=400_000_000),
            bench_row("model", "sdpa-transformer", "compiled", (4, 2048, 1664), 70.0, peer=True, preset="400m",
                      tokens_per_call=8192, params=398_000_000),
            bench_row("gen", "samu", "auto", (1, 64, 1664), 17.5, preset="400m", tokens_per_call=64, cuda_graph=True),
            bench_row("gen", "rglru", "auto", (1, 64, 1664), 18.25, preset="400m", tokens_per_call=64,
                      cuda_graph=True),
            bench_row("gen", "samu", "eager", (1, 64, 1664), 250.0, preset="400m", tokens_per_call=64,
                      cuda_graph=False),
            bench_row("gen", "samu", "auto", (8, 64, 1664), 20.0, preset="400m", tokens_per_call=512, cuda_graph=True),
            bench_row("prefill", "samu", "auto", (1, 512, 1664), 10.0, preset="400m", tokens_per_call=512),
            bench_row("prefill", "samu", "auto", (8, 512, 1664), 40.0, preset="400m", tokens_per_call=4096),
            bench_row("packed", "samu", "auto", (1, 32768, 2048), 1.0),
            dict(bench_row("packed", "samu", "auto", (1, 32768, 2048), 1.03125), candidate="samu/auto@16"),
            dict(bench_row("packed", "samu", "auto", (1, 32768, 2048), 1.125), candidate="samu/auto@256"),
            bench_row("packed", "rglru", "auto", (1, 32768, 2048), 2.0),
            dict(bench_row("packed", "rglru", "auto", (1, 32768, 2048), 2.0625), candidate="rglru/auto@16")],
            complete=False),
        "gates/2026-01-02-gates.json": record("gate", "2026-01-02T01:00:00Z", [
            gate_row("samu", "torch", (1, 8192, 1024), True),
            gate_row("samu", "triton_x", (1, 8192, 1024), False),
            gate_row("rglru", "torch", (1, 8192, 1024), True),
            dict(gate_row("samu", "triton_x", (1, 8192, 1024), True), documents=16,
                 shape_class="bfloat16|L<=8192|D<=1024|packed")], gates_version=1),
        # newest of all, but quarantined: nothing in it may reach the report
        "quarantine/2026-02-01-wrong.json": record("bench", "2026-02-01T00:00:00Z", [
            bench_row("fb", "samu", "auto", (1, 8192, 1024), 0.4242),
            bench_row("fb", "rglru", "auto", (1, 8192, 1024), 0.5353)]),
        "quarantine/2026-02-01-gates.json": record("gate", "2026-02-01T00:00:00Z", [
            gate_row("rglru", "torch", (1, 8192, 1024), False, worst_q="dx")], gates_version=1),
    }
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The report built twice from the same fixture records, in two separate folders."""
    built = []
    for name in ("first", "second"):
        root = tmp_path_factory.mktemp(name)
        write_fixtures(root)
        path, digest = build_report(root)
        built.append((root, path.read_text(), digest))
    return built


def test_report_is_byte_identical_across_runs(reports):
    (root_a, text_a, _), (root_b, text_b, _) = reports
    assert text_a == text_b
    figures_a = sorted(p.name for p in (root_a / "figures").iterdir())
    assert figures_a == ["floor_ratio.png", "gen_tokens_per_s.png", "peak_memory.png", "samu_rglru_ratio.png",
                         "time_vs_length.png"]
    for name in figures_a:
        assert (root_a / "figures" / name).read_bytes() == (root_b / "figures" / name).read_bytes(), name


def test_report_matches_golden(reports):
    text = reports[0][1]
    if os.environ.get("SAMU_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_newest_record_wins_and_quarantine_is_never_read(reports):
    text = reports[0][1]
    assert "| 1x8192x1024 | bfloat16 | 0.02097 | 1.234 | 2.468 | 0.50 |" in text
    assert "7.777" not in text and "8.888" not in text
    assert "0.4242" not in text and "0.5353" not in text and "quarantine/" not in text.replace(
        "never from `results/quarantine/`", "")
    # the quarantined gate failure must not block rglru/torch
    assert "RG-LRU `torch`" not in text
    assert "SAMU `triton_x` in `bfloat16|L<=8192|D<=1024`" in text


def test_every_number_row_cites_its_record(reports):
    text = reports[0][1]
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows and all(".json](" in line for line in rows)
    assert "**no** (stopped early)" in text
    assert "| SAMU | ascan-complex" not in text and "samu/ascan-complex | 31.25" in text
    assert "skipped rglru/ascan-scalar: accelerated-scan is not installed" in text
    assert "failed samu/torch fwd 4x2048x2048: OutOfMemoryError" in text


def test_brief_digest(reports):
    digest = reports[0][2]
    assert "gates: 3 pass, 1 fail" in digest   # the packed row counts on its own
    assert "FAIL samu triton_x 1x8192x1024 bfloat16: y" in digest
    line = next(x for x in digest.splitlines() if x.startswith("fb    1x8192x1024"))
    assert "1.234" in line and "2.468" in line and "0.50" in line and "rglru/fla-chunk_hgrn=flagged" in line
    assert "samu/ascan-complex=25.32" in line


def test_a_flagged_peer_is_shown_without_a_ratio(reports):
    text = reports[0][1]
    rows = [line for line in text.splitlines() if "| rglru/fla-chunk_hgrn |" in line]
    assert rows and all("| flagged: output disagrees |" in line and "4.25e-02 / 8.64e-03" in line for line in rows)
    assert "12.36" not in text
    assert "| samu/ascan-complex | 31.25 | 1.234 | 25.32 |" in text and "1.50e-06 / 8.64e-03" in text
    # nor is it drawn beside samu in the sweep figures
    units, _, _ = collect(load_records(reports[0][0]))
    series = [name for groups in _sweeps(units, 1).values() for name in groups]
    assert "rglru/fla-chunk_hgrn" not in series and "samu/ascan-complex" in series


def test_figures_no_record_supports_are_removed(tmp_path):
    write_fixtures(tmp_path)
    (tmp_path / "figures").mkdir()
    # the report being replaced showed time_vs_width.png; mine.png is no figure of it
    (tmp_path / "REPORT.md").write_text("# samu measurement report\n\n![time_vs_width](figures/time_vs_width.png)\n")
    for name in ("time_vs_width.png", "mine.png"):
        (tmp_path / "figures" / name).write_bytes(b"stale")
    build_report(tmp_path)
    assert not (tmp_path / "figures" / "time_vs_width.png").exists()
    assert (tmp_path / "figures" / "time_vs_length.png").exists() and (tmp_path / "figures" / "mine.png").exists()
    # a report without figures keeps the list: the next one with figures still removes what is stale
    (tmp_path / "figures" / "floor_ratio.png").rename(tmp_path / "figures" / "old_figure.png")
    text = (tmp_path / "REPORT.md").read_text().replace("floor_ratio.png", "old_figure.png")
    (tmp_path / "REPORT.md").write_text(text)
    build_report(tmp_path, figures=False)
    assert "old_figure.png" in (tmp_path / "REPORT.md").read_text()
    build_report(tmp_path)
    assert not (tmp_path / "figures" / "old_figure.png").exists() and (tmp_path / "figures" / "mine.png").exists()


def test_a_file_samu_did_not_write_is_never_overwritten(tmp_path):
    write_fixtures(tmp_path)
    notes = tmp_path / "notes.md"
    notes.write_text("mine")
    with pytest.raises(FileExistsError, match="not a report samu wrote"):
        build_report(tmp_path, notes)
    assert notes.read_text() == "mine"


def test_the_committed_report_is_what_its_records_make(tmp_path):
    # results/REPORT.md must be regenerated (`samu report`) in the commit that adds, moves or quarantines a record
    results = Path(__file__).parents[2] / "results"
    out, _ = build_report(results, tmp_path / "REPORT.md")
    assert out.read_text() == (results / "REPORT.md").read_text(), "results/REPORT.md is stale: run `samu report`"


def test_each_platform_keeps_its_own_gate_rows(tmp_path):
    # a newer gate record from another GPU lists beside the first platform's rows, never over them, and what it
    # fails blocks that platform alone
    write_fixtures(tmp_path)
    other = dict(ENV, gpu="NVIDIA H100 80GB HBM3")
    (tmp_path / "gates" / "2026-01-05-h100-gates.json").write_text(json.dumps(record(
        "gate", "2026-01-05T00:00:00Z", [gate_row("samu", "triton_x", (1, 8192, 1024), True),
                                         gate_row("rglru", "torch", (1, 8192, 1024), False, worst_q="dx")],
        gates_version=1, env=other)))
    text = build_report(tmp_path, figures=False)[0].read_text()
    h200 = "| NVIDIA H200, Triton 3.6 | SAMU | triton_x | triton_x | 1x8192x1024 | bfloat16 |"
    h100 = "| NVIDIA H100 80GB HBM3, Triton 3.6 | SAMU | triton_x | triton_x | 1x8192x1024 | bfloat16 |"
    assert h200 in text and h100 in text
    assert "**FAIL**" in text.split(h200)[1].splitlines()[0] and "| pass |" in text.split(h100)[1].splitlines()[0]
    assert "* NVIDIA H100 80GB HBM3, Triton 3.6: RG-LRU `torch`" in text
    assert "* NVIDIA H200, Triton 3.6: SAMU `triton_x`" in text
    assert "* NVIDIA H200, Triton 3.6: RG-LRU" not in text and "H100 80GB HBM3, Triton 3.6: SAMU" not in text
