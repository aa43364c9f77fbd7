"""``samu report``: REPORT.md and its figures, from the JSON records alone, deterministically.

For every (scope, shape, dtype) the report uses the newest record that measured it, and takes
all of that unit's rows from that one record, so every ratio compares candidates timed side by
side in one run. Every table row and figure cites its record file.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from samu.bench.records import flagged, load_records
from samu.bench.shapes import BLOCK, GEN, LENGTH, PREFILL, PRIMARY, STEP, WIDTH, shape_str
from samu.models.flops import mfu, peak_flops_of

OP_LABEL = {"samu": "SAMU", "rglru": "RG-LRU"}
MAIN = {"samu": "samu/auto", "rglru": "rglru/auto"}
SCOPE_TITLE = {"fwd": "mixer forward", "fb": "mixer forward + backward", "block": "RMSNorm + RecurrentBlock forward + backward",
               "step": "one residual layer: forward, backward, AdamW step", "model": "full-model training step",
               "gen": "generation: L greedy decoding steps of the full model for B sequences (ms per call)",
               "prefill": "prefill: the full model's forward over B prompts of L tokens, with its state (ms per call)",
               "packed": "packed sequences: mixer forward + backward of one row, unpacked and packed"}
MIB = float(1 << 20)

TITLE = "# samu measurement report"


@dataclass
class Unit:
    scope: str
    shape: tuple
    dtype: str
    path: str
    created: str
    rows: dict = field(default_factory=dict)


def collect(records) -> tuple[dict, list, list]:
    """(bench units by (scope, shape, dtype), newest gate rows per platform the gates speak for, records used)."""
    from samu.gates.runner import record_platform

    units: dict = {}
    gates: dict = {}
    for path, record in records:
        stamp = (record["created"], path)
        if record["kind"] == "bench":
            for row in record["rows"]:
                key = (row["scope"], tuple(row["shape"]), row["dtype"])
                unit = units.get(key)
                if unit is None or stamp > (unit.created, unit.path):
                    unit = units[key] = Unit(key[0], key[1], key[2], path, record["created"])
                if (unit.created, unit.path) == stamp:
                    unit.rows[row["candidate"]] = row
        else:
            platform = record_platform(record)
            for row in record["rows"]:
                key = (platform, row["op"], row["backend"], tuple(row["shape"]), row["dtype"],
                       row.get("documents") or 0)
                if key not in gates or stamp > gates[key][0]:
                    gates[key] = (stamp, row)
    gate_rows = [dict(row, _record=stamp[1], _platform=key[0]) for key, (stamp, row) in sorted(gates.items())]
    used = sorted({u.path for u in units.values()} | {r["_record"] for r in gate_rows})
    return units, gate_rows, [(p, r) for p, r in records if p in used]


def _ms(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _e(v) -> str:
    return "n/a" if v is None else f"{v:.2e}"


def _mib(v) -> str:
    return "n/a" if v is None else f"{v / MIB:.1f}"


def _launches(row) -> str:
    return "n/a" if row is None or not row.get("launches") else str(row["launches"]["total"])


def _pair(a, b, fmt) -> str:
    return f"{fmt(a)} / {fmt(b)}"


def _ratio(a, b) -> "float | None":
    return a / b if a is not None and b else None


def _get(row, key):
    return None if row is None else row.get(key)


def _link(path: str) -> str:
    return f"[{Path(path).name}]({path})"


def _title(text: str) -> str:
    return text[:1].upper() + text[1:]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    # a literal "|" (shape classes use it) would split a Markdown cell
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return lines + [""]


def _dtypes(units) -> list[str]:
    return sorted({k[2] for k in units})


def _paired(units, scope, shapes):
    """(unit, SAMU row, RG-LRU row) of ``scope`` at ``shapes`` (in that order), every dtype; units with
    neither dispatched row are left out."""
    for shape in shapes:
        for dtype in _dtypes(units):
            u = units.get((scope, tuple(shape), dtype))
            if u is not None and (MAIN["samu"] in u.rows or MAIN["rglru"] in u.rows):
                yield u, u.rows.get(MAIN["samu"]), u.rows.get(MAIN["rglru"])


def _times(s, r) -> list[str]:
    """SAMU ms, RG-LRU ms, their ratio."""
    s_ms, r_ms = _get(s, "median_ms"), _get(r, "median_ms")
    return [_ms(s_ms), _ms(r_ms), _x(_ratio(s_ms, r_ms))]


def _tail(u, s, r) -> list[str]:
    """Launches, analytic scratch, dispatch choice (SAMU / RG-LRU) and the record."""
    return [f"{_launches(s)} / {_launches(r)}", _pair(_get(s, "scratch_bytes"), _get(r, "scratch_bytes"), _mib),
            f"{_get(s, 'choice') or 'n/a'} / {_get(r, 'choice') or 'n/a'}", _link(u.path)]


def _io_bytes(u: Unit) -> "int | None":
    """Bytes of y plus dx (forward + backward) or of y (forward): what a mixer must hand back."""
    B, L, D = u.shape
    size = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}[u.dtype]
    return (2 if u.scope == "fb" else 1) * B * L * D * size


def mixer_table(units, scope, shapes) -> list[str]:
    rows = []
    for u, s, r in _paired(units, scope, shapes):
        floor = _get(s, "floor_ms") or _get(r, "floor_ms")
        rows.append([shape_str(u.shape), u.dtype, _ms(floor), *_times(s, r),
                     _pair(_get(s, "floor_ratio"), _get(r, "floor_ratio"), _x),
                     _pair(_get(s, "peak_alloc"), _get(r, "peak_alloc"), _mib),
                     _pair(_ratio(_get(s, "peak_alloc"), _io_bytes(u)), _ratio(_get(r, "peak_alloc"), _io_bytes(u)),
                           _x),
                     *_tail(u, s, r)])
    if not rows:
        return ["No records.", ""]
    return _table(["shape", "dtype", "floor ms", "SAMU ms", "RG-LRU ms", "SAMU / RG-LRU", "x floor (S / R)",
                   "peak alloc MiB (S / R)", "peak / out bytes (S / R)", "launches (S / R)", "scratch MiB (S / R)",
                   "dispatch (S / R)", "record"], rows)


def module_table(units, scope, shapes) -> list[str]:
    rows = []
    for u, s, r in _paired(units, scope, shapes):
        preset = _get(s, "preset") or _get(r, "preset")
        rows.append([shape_str(u.shape) + (f" ({preset})" if preset else ""), u.dtype, *_times(s, r),
                     _pair(_get(s, "peak_alloc"), _get(r, "peak_alloc"), _mib),
                     _pair(_get(s, "peak_reserved"), _get(r, "peak_reserved"), _mib),
                     f"{_get(s, 'params') or 'n/a'} / {_get(r, 'params') or 'n/a'}", *_tail(u, s, r)])
    if not rows:
        return ["No records.", ""]
    return _table(["shape", "dtype", "SAMU ms", "RG-LRU ms", "SAMU / RG-LRU", "peak alloc MiB (S / R)",
                   "peak reserved MiB (S / R)", "params (S / R)", "launches (S / R)", "mixer scratch MiB (S / R)",
                   "mixer dispatch (S / R)", "record"], rows)


def block_gemm_table(units, shapes) -> list[str]:
    """Each block row against its two projection GEMMs alone (forward + backward, same run)."""
    rows = []
    for shape in shapes:
        for dtype in _dtypes(units):
            u = units.get(("block", tuple(shape), dtype))
            for op in ("samu", "rglru"):
                block, gemm = (None, None) if u is None else (u.rows.get(f"{op}/auto"), u.rows.get(f"{op}/gemm"))
                if block is None or gemm is None:
                    continue
                compiled = u.rows.get(f"{op}/compiled")
                rows.append([shape_str(u.shape), dtype, OP_LABEL[op], _ms(block["median_ms"]),
                             _ms(_get(compiled, "median_ms")), _ms(gemm["median_ms"]),
                             _x(_ratio(block["median_ms"], gemm["median_ms"])),
                             _x(_ratio(_get(compiled, "median_ms"), gemm["median_ms"])), _link(u.path)])
    if not rows:
        return ["No block records with the GEMM-only candidate.", ""]
    return _table(["shape", "dtype", "mixer", "block ms (eager)", "block ms (compiled)", "GEMMs ms",
                   "eager / GEMMs", "compiled / GEMMs", "record"], rows)


def model_table(units, gpus: dict) -> list[str]:
    """Every model-scope candidate (samu's LMs and the model peers, eager and compiled): tokens/s, MFU."""
    rows = []
    for key in sorted(k for k in units if k[0] == "model"):
        u = units[key]
        base = u.rows.get("samu/compiled") or u.rows.get("samu/auto")
        peak = peak_flops_of(gpus.get(u.path))
        for name, row in sorted(u.rows.items(), key=lambda kv: kv[1]["median_ms"]):
            tokens = row.get("tokens_per_call") or u.shape[0] * u.shape[1]
            rate = tokens / (row["median_ms"] / 1e3)
            share = mfu(row["params"], rate, peak)
            rows.append([shape_str(u.shape) + (f" ({row.get('preset')})" if row.get("preset") else ""), u.dtype,
                         name, f"{row['params'] / 1e6:.1f}M", _ms(row["median_ms"]), f"{rate / 1e3:.1f}K",
                         "n/a" if share is None else f"{share:.0%}",
                         _x(_ratio(_get(base, "median_ms"), row["median_ms"])),
                         _mib(row.get("peak_alloc")), _link(u.path)])
    if not rows:
        return ["No records.", ""]
    return _table(["shape", "dtype", "model", "params", "ms per step", "tokens/s", "MFU",
                   "speed vs samu (compiled, else eager)", "peak alloc MiB", "record"], rows)


def _inference_rows(units):
    """(scope, unit, candidate, row, tokens/s) of every gen and prefill row, by scope, shape and candidate."""
    for key in sorted(k for k in units if k[0] in ("gen", "prefill")):
        u = units[key]
        for name, row in sorted(u.rows.items()):
            tokens = row.get("tokens_per_call") or u.shape[0] * u.shape[1]
            yield key[0], u, name, row, tokens / (row["median_ms"] / 1e3)


def generation_table(units) -> list[str]:
    """Decoding and prefill tokens/s of every gen and prefill row."""
    rows = []
    for scope, u, name, row, rate in _inference_rows(units):
        B, L, _ = u.shape
        per_token = row["median_ms"] / L if scope == "gen" else None
        how = ("CUDA graph" if row.get("cuda_graph") else "eager") if scope == "gen" else "forward"
        rows.append([scope, shape_str(u.shape) + (f" ({row.get('preset')})" if row.get("preset") else ""), u.dtype,
                     name, how, str(B), _ms(per_token), f"{rate:,.0f}", _link(u.path)])
    if not rows:
        return ["No records.", ""]
    return _table(["scope", "shape", "dtype", "model", "how", "batch", "ms per decoding step", "tokens/s", "record"],
                  rows)


def packed_table(units) -> list[str]:
    """Each packed candidate against the same implementation unpacked, timed side by side."""
    rows = []
    for key in sorted(k for k in units if k[0] == "packed"):
        u = units[key]
        for name in sorted(n for n in u.rows if "@" in n):
            row, plain = u.rows[name], u.rows.get(name.split("@")[0])
            rows.append([shape_str(u.shape), u.dtype, OP_LABEL[row["op"]], name, name.split("@")[1],
                         _ms(_get(plain, "median_ms")), _ms(row["median_ms"]),
                         _x(_ratio(row["median_ms"], _get(plain, "median_ms"))), row.get("choice") or "n/a",
                         _link(u.path)])
    if not rows:
        return ["No records.", ""]
    return _table(["shape", "dtype", "mixer", "candidate", "sequences", "unpacked ms", "packed ms",
                   "packed / unpacked", "dispatch (packed)", "record"], rows)


def peer_table(units) -> list[str]:
    rows = []
    for key in sorted(k for k in units if k[0] in ("fwd", "fb")):
        u = units[key]
        for op in ("samu", "rglru"):
            ours = u.rows.get(MAIN[op])
            for name in sorted(n for n, row in u.rows.items() if row["op"] == op and n != MAIN[op]):
                peer = u.rows[name]
                agree = peer.get("agreement") or {}
                ratio = "flagged: output disagrees" if flagged(peer) else _x(
                    _ratio(peer["median_ms"], _get(ours, "median_ms")))
                rows.append([shape_str(u.shape), u.dtype, u.scope, OP_LABEL[op], name, _ms(peer["median_ms"]),
                             _ms(_get(ours, "median_ms")), ratio,
                             _pair(peer.get("peak_alloc"), _get(ours, "peak_alloc"), _mib),
                             _pair(agree.get("rel_error"), agree.get("threshold"), _e), _link(u.path)])
    if not rows:
        return ["No peer rows in the records.", ""]
    return _table(["shape", "dtype", "scope", "mixer", "peer", "peer ms", "samu ms (dispatch)", "peer / samu",
                   "peak alloc MiB (peer / samu)", "rel. error vs samu (y, fb: y or dx) / limit", "record"], rows)


def scratch_lines(units) -> list[str]:
    formulas = sorted({(row["op"], row["choice"], row["scratch_formula"]) for u in units.values()
                       for row in u.rows.values() if row.get("scratch_formula")})
    if not formulas:
        return ["No record names a Triton variant's scratch (the torch backend has none declared).", ""]
    return [f"* {OP_LABEL[op]} `{choice}`: `{formula}`" for op, choice, formula in formulas] + [""]


def _platform(platform: str) -> str:
    """A platform key (gate_status.platform: "GPU|triton X.Y") as the report writes it."""
    return platform.replace("|triton ", ", Triton ")


def gate_tables(gate_rows) -> list[str]:
    if not gate_rows:
        return ["No gate records.", ""]
    summary, detail = [], []
    for row in gate_rows:
        ratios = [(row["errors"][q] / row["thresholds"][q], q) for q in row["passed"]
                  if row["errors"].get(q) is not None and row["thresholds"].get(q)]
        worst = max(ratios) if ratios else None
        failing = [q for q, ok in sorted(row["passed"].items()) if not ok]
        if "exception" in row:
            failing.append("crashed: " + row["exception"].splitlines()[0][:80])
        shape = shape_str(row["shape"]) + (f" in {row['documents']} sequences" if row.get("documents") else "")
        summary.append([_platform(row["_platform"]), OP_LABEL[row["op"]], row["backend"], row["variant"], shape,
                        row["dtype"], row["shape_class"], "pass" if row["pass"] else "**FAIL**",
                        "n/a" if worst is None else f"{worst[0]:.3f} ({worst[1]})", ", ".join(failing) or "-",
                        _link(row["_record"])])
        cells = [f"{q} {row['errors'][q]:.2e} / {row['thresholds'][q]:.2e}"
                 if row["errors"].get(q) is not None and row["thresholds"].get(q) is not None else f"{q} n/a"
                 for q in row["passed"]]
        detail.append([_platform(row["_platform"]), OP_LABEL[row["op"]], row["backend"], shape, row["dtype"],
                       "<br>".join(cells)])
    lines = _table(["platform", "mixer", "backend", "variant", "shape", "dtype", "shape class", "result",
                    "worst error / threshold", "failing", "record"], summary)
    lines += ["Each result's relative Frobenius error against the float64 reference, and its threshold:", ""]
    return lines + _table(["platform", "mixer", "backend", "shape", "dtype", "error / threshold"], detail)


def status_lines(gate_records) -> list[str]:
    """What the gate records block from dispatch, platform by platform (a GPU and Triton release each)."""
    from samu.gates.runner import status_by_platform

    blocked = [(platform, key) for platform, section in status_by_platform(gate_records).items()
               for key in section["blocked"]]
    if not blocked:
        return ["No (op, variant, shape class) is blocked by the gate records on any platform.", ""]
    lines = [f"* {_platform(platform)}: {OP_LABEL[op]} `{variant}` in `{cls}`"
             for platform, (op, variant, cls) in blocked]
    return ["Blocked from dispatch (latest gate failed):", ""] + lines + [""]


def notes_lines(records) -> list[str]:
    lines = []
    for path, record in records:
        for item in record.get("skipped", []):
            what = item.get("candidate") or item.get("backend")
            lines.append(f"* skipped {what}: {item['reason']} ({_link(path)})")
        for item in record.get("failed", []):
            lines.append(f"* failed {item['candidate']} {item['scope']} {shape_str(item['shape'])}: "
                         f"{item['error'].splitlines()[0][:160]} ({_link(path)})")
    unique = list(dict.fromkeys(lines))
    return (unique or ["None."]) + [""]


def records_table(records) -> list[str]:
    rows = []
    for path, r in records:
        env = r["env"]
        bw = r.get("copy_bandwidth", {}).get("bytes_per_s")
        rows.append([_link(path), r["kind"], r["created"], env.get("gpu") or env.get("device"), env.get("driver") or "n/a",
                     env["torch"], env.get("triton") or "n/a", (env.get("git_commit") or "unknown")[:12],
                     "n/a" if bw is None else f"{bw / 1e12:.2f} TB/s",
                     "yes" if r.get("complete", True) else "**no** (stopped early)", f"`{r['command']}`"])
    if not rows:
        return ["No records.", ""]
    return _table(["record", "kind", "created", "device", "driver", "torch", "triton", "commit", "copy bandwidth",
                   "complete", "command"], rows)


def _spread_text(value, spread, digits=3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" + ("" if spread is None else f" ± {spread:.{digits}f}")


def compare_markdown(record: dict) -> list[str]:
    """A ``samu compare`` record's tables: final bits, training tokens/s and the training time to the final
    bits of the RG-LRU run of the same seed, then bits by position in the context."""
    unit = record["unit"]
    rows = []
    for t in record["table"]:
        rate = "—" if t["tokens_per_s"] is None else f"{t['tokens_per_s'] / 1e3:,.1f}K"
        time = "—" if t["time_to_rglru_s"] is None else f"{t['time_to_rglru_s']:.0f} s"
        paired = t["paired_with_rglru"]
        reached = f"{time} ({t['reached_rglru']} of {paired} reached)" if paired else "—"
        rows.append([t["arm"], str(t["seq_len"]), str(len(t["seeds"])), f"{t['params'] / 1e6:.1f}M",
                     _spread_text(t["bits"], t["bits_spread"]), rate, reached])
    out = _table(["model", "L", "seeds", "params", f"final {unit} (mean ± half-range)", "training tokens/s",
                  f"training time to RG-LRU's final {unit}"], rows)
    for seq_len in sorted({t["seq_len"] for t in record["table"]}):
        group = [t for t in record["table"] if t["seq_len"] == seq_len]
        bins = group[0]["position_bins"]
        out += [f"{unit.capitalize()} by position in the context, L = {seq_len}:", ""]
        out += _table(["model"] + [f"positions {b['from']}–{b['to'] - 1}" for b in bins],
                      [[t["arm"]] + [_spread_text(b["bits"], b["spread"]) for b in t["position_bins"]] for t in group])
    return out


def compare_plots(record: dict, folder, stem: str) -> list[Path]:
    """Validation bits against tokens and against training time (each arm's seeds: mean line and points,
    min-max band), and bits by position, as ``<stem>_*.png`` in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    study, unit, written = record["study"], record["unit"], []
    main = [r for r in record["runs"] if r["seq_len"] == study["seq_len"]]

    def save(fig, ax, name, xlabel, title):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"validation {unit}")
        ax.set_title(title)
        ax.legend()
        ax.grid(alpha=0.3)
        path = folder / f"{stem}_{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    for axis, name, xlabel in (("tokens", "vs_tokens", "tokens trained"), ("time_s", "vs_time", "training time (s)")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for arm in study["arms"]:
            rs = [r for r in main if r["arm"] == arm]
            if not rs:
                continue
            n = min(len(r["val"]) for r in rs)
            xs = [statistics.fmean(r["val"][i][axis] for r in rs) for i in range(1, n)]
            ys = [[r["val"][i]["bits"] for r in rs] for i in range(1, n)]
            line, = ax.plot(xs, [statistics.fmean(y) for y in ys], marker="o", label=f"{arm} ({len(rs)} seeds)")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.2)
        save(fig, ax, name, xlabel, f"{study['preset']} preset, L = {study['seq_len']}")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for t in record["table"]:
        centers = [(b["from"] + b["to"] - 1) / 2 for b in t["position_bins"]]
        ax.plot(centers, [b["bits"] for b in t["position_bins"]], marker="o", label=f"{t['arm']}, L = {t['seq_len']}")
    ax.set_xscale("symlog", linthresh=16)
    save(fig, ax, "by_position", "position in the context (bin centre)", f"{unit} by position")
    return written


def compare_section(results: Path, figures_dir: "Path | None") -> tuple[list[str], list[str]]:
    """The report's language-model comparison: each ``samu compare`` record under results/compare, its
    tables and (with ``figures_dir``) its figures regenerated there. Returns (lines, figure file names)."""
    from samu.compare import SCHEMA, rerun_rows, study_of

    records = []
    for path in sorted((results / "compare").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(record, dict) or record.get("schema") != SCHEMA:
            continue
        missing = [k for k in ("study", "unit", "table", "runs", "env", "command") if k not in record]
        if missing:
            raise ValueError(f"{path}: a samu compare record without {', '.join(missing)}")
        records.append((path, record))
    # a rerun of part of an earlier study is shown under that study (the earliest it reruns), not on its own
    study = {id(r): study_of(r, [s for _, s in records]) for _, r in records}
    lines, names = [], []
    for path, record in records:
        if study[id(record)] is not None:
            continue
        definition, env = record["study"], record["env"]
        source = _link(path.relative_to(results).as_posix())
        lines += [f"### {definition['preset']} preset, L = {definition['seq_len']} ({source})", "",
                  f"`{record['command']}` on {env.get('gpu') or env.get('device')}, commit {env.get('git_commit')}. "
                  f"Each arm trains on the same batches in the same order with the same schedule and seeds; ± is "
                  f"half the range over seeds (none for one seed); training times include compilation.", ""]
        lines += compare_markdown(record)
        if figures_dir is not None:
            for fig in compare_plots(record, figures_dir, path.stem):
                names.append(fig.name)
                lines += [f"![{fig.stem}](figures/{fig.name})", ""]
        reruns = [(p, r) for p, r in records if study[id(r)] is record]
        rows = [[_link(p.relative_to(results).as_posix()), row["arm"], str(row["seq_len"]),
                 ", ".join(map(str, row["seeds"])), _spread_text(row["bits"], row["bits_spread"], 4),
                 _spread_text(row["study_bits"], row["study_spread"], 4),
                 {True: "yes", False: "no", None: "—"}[row["within"]]]
                for p, r in reruns for row in rerun_rows(r, record)]
        if rows:
            unit = record["unit"]
            lines += ["Reruns of this study (the same definition, its runs trained again; seeds by number):", ""]
            lines += _table(["record", "model", "L", "seeds", f"rerun's final {unit}", "study's",
                             "rerun's mean within the study's ±"], rows)
    if not lines:
        lines = ["No `samu compare` record under `results/compare/` yet.", ""]
    return ["## Language-model comparison (samu compare)", ""] + lines, names


def render(units, gate_rows, records, figures, comparison=()) -> str:
    gate_records = [(p, r) for p, r in records if r["kind"] == "gate"]
    out = [TITLE, "",
           "Generated by `samu report` from the JSON records under `results/` (never from `results/quarantine/`).",
           "Do not edit by hand: rerun `samu report`. Times are medians over two counterbalanced rounds; "
           "ratios compare rows timed side by side in one record. `S / R` = SAMU / RG-LRU; "
           "`x floor` = time over the memory floor (bytes a mixer must move / copy bandwidth of the same run). "
           "samu's per-call parameter finiteness check is off in the timed calls unless a record says otherwise "
           "(`timing.check_finite`). `out bytes` = bytes of y (fwd) or of y and dx (fwd + bwd).", "",
           "## Records", ""] + records_table(records)
    for scope in ("fb", "fwd"):
        out += [f"## {_title(SCOPE_TITLE[scope])}: primary shapes", ""] + mixer_table(units, scope, PRIMARY)
    out += ["## Length sweep (mixer forward + backward)", ""] + mixer_table(units, "fb", LENGTH)
    out += ["## Width sweep (mixer forward + backward)", ""] + mixer_table(units, "fb", WIDTH)
    out += ["## Packed sequences (mixer forward + backward)", "",
            "One row of B = 1 timed unpacked and packed into N sequences (cu_seqlens; their lengths drawn as the "
            "packed gates draw them) in the same run: `packed / unpacked` is what the boundaries cost.",
            ""] + packed_table(units)
    out += ["## Peers side by side", "",
            "Each peer (and any other candidate) is timed in the same run as the dispatched samu op on the same "
            "inputs; the ratio is its time over samu's. Its y (and in the fb scope its dx) is checked against "
            "samu's on those inputs after the timing: a candidate further off than two results within the bf16/fp16 "
            "gate of y can be (`limit`) is marked `flagged: output disagrees`, gets no ratio and is left out of the "
            "figures.", ""] + peer_table(units)
    named = tuple(dict.fromkeys(PRIMARY + LENGTH + WIDTH + BLOCK + STEP + GEN + PREFILL))
    gpus = {p: r.get("env", {}).get("gpu") for p, r in records}
    for scope in ("block", "step", "model", "gen", "prefill"):
        shapes = named + tuple(sorted({k[1] for k in units if k[0] == scope} - set(named)))
        out += [f"## {_title(SCOPE_TITLE[scope])}", ""] + module_table(units, scope, shapes)
        if scope == "block":
            out += ["### The block against its GEMMs", "",
                    "`GEMMs` times the block's in- and out-projection GEMMs alone, forward + backward, in the "
                    "same run: the floor the glue and the mixer add to.", ""] + block_gemm_table(units, shapes)
        if scope == "model":
            out += ["### Every model side by side", "",
                    "samu's language models and the model peers of the same preset shape, eager (`/auto`) and "
                    "through torch.compile (`/compiled`), one training step each (forward, cross-entropy, "
                    "backward, AdamW). MFU = 6 · params · tokens/s over the GPU's dense bf16 peak (attention's own FLOPs "
                    "are not counted, so it understates a transformer at long L; tokens/s compare).", ""]
            out += model_table(units, gpus)
        if scope == "prefill":
            out += ["### Generation in tokens/s", "",
                    "Decoding (`gen`: L tokens per row from a 16-token prompt's state, greedy) and prefill "
                    "(`prefill`: the forward over B prompts of L tokens) of the model cast to the dtype. "
                    "`/auto` decodes as generate() does (a CUDA graph replay per token on CUDA), `/eager` runs "
                    "the same step without the graph.", ""] + generation_table(units)
    other = sorted({k[1] for k in units if k[0] in ("fwd", "fb")} - set(PRIMARY + LENGTH + WIDTH))
    if other:
        out += ["## Other mixer shapes", ""]
        for scope in ("fb", "fwd"):
            out += [f"### {_title(SCOPE_TITLE[scope])}", ""] + mixer_table(units, scope, other)
    out += list(comparison)
    out += ["## Analytic scratch of the dispatched variants", ""] + scratch_lines(units)
    out += ["## Correctness gates", "", "Thresholds from `samu/gates/gates.toml` (docs/spec.md §7).", ""]
    out += gate_tables(gate_rows) + status_lines(gate_records)
    out += ["## Figures", ""]
    if not figures:
        out += ["No figures (no records for them, or `--no-figures`).", ""]
    for name, caption, sources in figures:
        out += [f"![{caption}](figures/{name})", "",
                f"*{caption}.* Source: " + ", ".join(_link(s) for s in sources) + ".", ""]
    out += ["## Skipped and failed candidates", ""] + notes_lines(records)
    return "\n".join(out).rstrip("\n") + "\n"


def _sweeps(units, axis: int) -> dict:
    """fb series along one shape axis: {(fixed dims, dtype): {candidate: [(x, ms)]}} with >= 2 points;
    flagged rows are left out."""
    groups: dict = {}
    for (scope, shape, dtype), u in sorted(units.items()):
        if scope != "fb":
            continue
        fixed = tuple(v for i, v in enumerate(shape) if i != axis)
        for name, row in sorted(u.rows.items()):
            if flagged(row):
                continue
            groups.setdefault((fixed, dtype), {}).setdefault(name, []).append((shape[axis], row["median_ms"], u.path))
    return {k: v for k, v in groups.items() if max(len(points) for points in v.values()) >= 2}


def figures_for(units, out_dir: Path) -> list:
    """Write the PNG figures into ``out_dir``; return [(file name, caption, sources)]."""
    from matplotlib.figure import Figure

    made = []
    out_dir.mkdir(parents=True, exist_ok=True)

    def save(fig, name, caption, sources):
        fig.tight_layout()
        # no Software/date metadata, so the same records give the same bytes
        fig.savefig(out_dir / name, dpi=110, metadata={"Software": None})
        made.append((name, caption, sorted(set(sources))))

    for axis, name, label, fixed_names, what in ((1, "time_vs_length.png", "sequence length L", ("B", "D"), "length"),
                                                  (2, "time_vs_width.png", "width D", ("B", "L"), "width")):
        groups = _sweeps(units, axis)
        if not groups:
            continue
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        sources = []
        for (fixed, dtype), series in groups.items():
            where = ", ".join(f"{n}={v}" for n, v in zip(fixed_names, fixed))
            for candidate, points in series.items():
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                        label=f"{candidate} ({where}, {dtype})")
                sources += [p[2] for p in points]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("median ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
        save(fig, name, f"Mixer forward + backward time vs {what}", sources)

    fb = [u for (scope, _, _), u in sorted(units.items()) if scope == "fb"]
    if fb:
        labels = [f"{shape_str(u.shape)}\n{u.dtype}" for u in fb]
        for name, key, ylabel, caption, scale in (
                ("floor_ratio.png", "floor_ratio", "time / memory floor",
                 "Mixer forward + backward time over the memory floor", 1.0),
                ("peak_memory.png", "peak_alloc", "peak allocated MiB",
                 "Mixer forward + backward peak allocated memory (CUDA only; no bar where not measured)", MIB)):
            fig = Figure(figsize=(max(6, 0.8 * len(fb) + 2), 4.5))
            ax = fig.add_subplot()
            for i, op in enumerate(("samu", "rglru")):
                # a value a record lacks is left out (NaN draws no bar), never drawn as 0
                values = [_get(u.rows.get(MAIN[op]), key) for u in fb]
                values = [float("nan") if v is None else v / scale for v in values]
                ax.bar([j + 0.4 * i - 0.2 for j in range(len(fb))], values, width=0.4, label=OP_LABEL[op])
            ax.set_xticks(range(len(fb)), labels, fontsize=6, rotation=45)
            ax.set_ylabel(ylabel)
            ax.legend()
            ax.grid(True, axis="y", alpha=0.3)
            save(fig, name, caption, [u.path for u in fb])

    series: dict = {}
    for scope, u, name, row, rate in _inference_rows(units):
        if scope == "gen" or u.shape[1] == PREFILL[0][1]:
            label = f"{scope} {name} (L={u.shape[1]}, {u.dtype})"
            series.setdefault(label, []).append((u.shape[0], rate, u.path))
    series = {k: v for k, v in series.items() if len(v) >= 2}
    if series:
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
        for label, points in sorted(series.items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linestyle="-" if label.startswith("gen") else "--", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch B")
        ax.set_ylabel("tokens/s")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
        save(fig, "gen_tokens_per_s.png", "Decoding (solid) and prefill (dashed) tokens/s against batch",
             [p[2] for points in series.values() for p in points])

    paired = [u for _, u in sorted(units.items()) if MAIN["samu"] in u.rows and MAIN["rglru"] in u.rows]
    if paired:
        fig = Figure(figsize=(max(6, 0.5 * len(paired) + 2), 4.5))
        ax = fig.add_subplot()
        values = [u.rows[MAIN["samu"]]["median_ms"] / u.rows[MAIN["rglru"]]["median_ms"] for u in paired]
        ax.bar(range(len(values)), values)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(values)), [f"{u.scope} {shape_str(u.shape)}\n{u.dtype}" for u in paired],
                      fontsize=6, rotation=60)
        ax.set_ylabel("SAMU / RG-LRU time")
        save(fig, "samu_rglru_ratio.png", "SAMU / RG-LRU time ratio per scope and shape (below 1: SAMU faster)",
             [u.path for u in paired])
    return made


def brief(units, gate_rows) -> str:
    """A short plain-text digest: one line per unit (SAMU vs RG-LRU, each other candidate's time
    over its mixer's dispatched op), then the gate verdicts."""
    lines = [f"{'scope':5} {'shape':13} {'dtype':8} {'SAMU ms':>8} {'RG ms':>8} {'S/R':>5} {'xfloor S/R':>13}  others / ours"]
    for (scope, shape, dtype), u in sorted(units.items()):
        s, r = u.rows.get(MAIN["samu"]), u.rows.get(MAIN["rglru"])
        others = [f"{name}=" + ("flagged" if flagged(row) else
                                _x(_ratio(row['median_ms'], _get(u.rows.get(MAIN.get(row['op'], MAIN['samu'])), 'median_ms'))))
                  for name, row in sorted(u.rows.items()) if name not in MAIN.values()]
        lines.append(f"{scope:5} {shape_str(shape):13} {dtype:8} {_ms(_get(s, 'median_ms')):>8} "
                     f"{_ms(_get(r, 'median_ms')):>8} {_x(_ratio(_get(s, 'median_ms'), _get(r, 'median_ms'))):>5} "
                     f"{_pair(_get(s, 'floor_ratio'), _get(r, 'floor_ratio'), _x):>13}  {' '.join(others)}")
    failed = [g for g in gate_rows if not g["pass"]]
    lines.append(f"gates: {len(gate_rows) - len(failed)} pass, {len(failed)} fail")
    lines += [f"  FAIL {g['op']} {g['backend']} {shape_str(g['shape'])} {g['dtype']}: "
              + (", ".join(q for q, ok in sorted(g["passed"].items()) if not ok) or g.get("exception", "")[:120])
              for g in failed]
    return "\n".join(lines)


def _previous_report(out: Path) -> str:
    """The text of the report at ``out`` that this one replaces ("" if none), or a FileExistsError if a file there
    is not a samu report: samu never overwrites files it did not write."""
    if not out.exists():
        return ""
    text = out.read_text(errors="replace") if out.is_file() else ""
    if not text.startswith(TITLE):
        raise FileExistsError(f"--out {out} exists and is not a report samu wrote; choose another path")
    return text


def build_report(results, out=None, figures: bool = True) -> tuple[Path, str]:
    """Write the report (and figures) for the records under ``results``; return (path, brief digest)."""
    results = Path(results)
    out = Path(out) if out else results / "REPORT.md"
    previous = _previous_report(out)
    units, gate_rows, used = collect(load_records(results))
    made = figures_for(units, out.parent / "figures") if figures else []
    comparison, compare_figures = compare_section(results, out.parent / "figures" if figures else None)
    # the figures this report lists are samu's: the next one removes those no record supports (and nothing else)
    listed = {name for names in re.findall(r"<!-- samu figures: ([^>]*) -->", previous) for name in names.split()
              if re.fullmatch(r"[^/\\]+\.png", name)}
    listed |= set(re.findall(r"\]\(figures/([^)/]+\.png)\)", previous))
    if figures:
        kept = {name for name, _, _ in made} | set(compare_figures)
        for name in sorted(listed - kept):
            (out.parent / "figures" / name).unlink(missing_ok=True)
        listed = kept
    manifest = f"\n<!-- samu figures: {' '.join(sorted(listed))} -->\n"
    out.write_text(render(units, gate_rows, used, made, comparison) + manifest)
    return out, brief(units, gate_rows)


def report_command(args) -> int:
    out, digest = build_report(args.results, args.out, figures=not args.no_figures)
    if args.brief:
        print(digest)
    print(f"report: {out}")
    return 0
