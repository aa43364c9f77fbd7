"""``samu gate``: run the SPEC §7 gates, write pass/fail records, keep dispatch's status current.

For each (op, shape, dtype) the float64 serial reference and the serial fp32 evaluation run once
on the same inputs; each backend is then compared with the reference for the output, the final
state, the input gradient, the initial-state gradient and every parameter gradient.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from samu import reference
from samu.bench.records import end_unit, environment, load_records, new_record, write_record
from samu.gates import reload, status_path
from samu.gates.inputs import PARAMS, RGLRU_C, derive_seed, make_inputs, rglru_heads
from samu.gates.rules import LOW_PRECISION, load_rules, rel_error
from samu.ops import dispatch
from samu.ops.functional import rglru_mixer, samu_mixer

RADIAL_BOUND = 2.0


def quantities(op: str) -> tuple:
    return ("y", "final_state", "dx", "d_initial_state") + tuple(f"d_{p}" for p in PARAMS[op])


def evaluate(op: str, inputs: dict, *, backend: "str | None" = None, ref_dtype: "torch.dtype | None" = None) -> dict:
    """One forward and backward: {quantity: tensor}. ``ref_dtype`` runs the serial reference in
    that dtype on the same (already rounded) inputs; otherwise the public op with ``backend``."""
    if ref_dtype is not None:
        x = inputs["x"].to(ref_dtype).requires_grad_()
        params = [p.to(ref_dtype).requires_grad_() for p in inputs["params"].values()]
        h0 = inputs["initial_state"].to(ref_dtype).requires_grad_()
        if op == "samu":
            y, h = reference.samu_mixer(x, *params, initial_state=h0, output_final_state=True,
                                        radial_bound=RADIAL_BOUND, dtype=ref_dtype)
        else:
            y, h = reference.rglru_mixer(x, *params, initial_state=h0, output_final_state=True, c=RGLRU_C,
                                         dtype=ref_dtype)
    else:
        x = inputs["x"].clone().requires_grad_()
        params = [p.clone().requires_grad_() for p in inputs["params"].values()]
        h0 = inputs["initial_state"].clone().requires_grad_()
        if op == "samu":
            y, h = samu_mixer(x, *params, initial_state=h0, output_final_state=True, radial_bound=RADIAL_BOUND,
                              backend=backend)
        else:
            y, h = rglru_mixer(x, *params, initial_state=h0, output_final_state=True, c=RGLRU_C, backend=backend)
    grads = torch.autograd.grad([y, h], [x, h0, *params], [inputs["dy"].to(y.dtype), inputs["dh"].to(h.dtype)])
    return dict(zip(quantities(op), (y.detach(), h.detach(), *grads)))


def _finite(value: float) -> "float | None":
    return value if math.isfinite(value) else None


def judge(op: str, dtype: torch.dtype, out: dict, ref: dict, serial_err: dict, rounded_err: dict, rules) -> dict:
    """Errors, thresholds and pass/fail of one backend's results against the reference."""
    errors, thresholds, rule_names, passed = {}, {}, {}, {}
    for q in quantities(op):
        err = rel_error(out[q], ref[q])
        base = serial_err[q]
        rounded = rounded_err.get(q)
        limit, rule = rules.threshold(q, dtype, base, rounded)
        errors[q], thresholds[q], rule_names[q] = _finite(err), _finite(limit), rule
        passed[q] = math.isfinite(err) and math.isfinite(limit) and err <= limit
    return {"errors": errors, "thresholds": thresholds, "rules": rule_names, "passed": passed,
            "pass": all(passed.values())}


def resolve_backends(op: str, requested: list[str], shape, dtype, device, heads: int = 16) -> tuple[list, list]:
    """[(backend, Variant or None)] to gate and [(backend, reason)] that cannot run here.

    ``variants`` expands to every registered Triton variant of ``op``; ``triton`` is the one
    dispatch picks; anything else is a backend name or a variant name.
    """
    names: list[str] = []
    for item in requested:
        expanded = sorted(dispatch.variants(op)) if item == "variants" else [item]
        names += [n for n in expanded if n not in names]
    runnable, skipped = [], []
    for name in names:
        if name in ("auto", "reference"):
            skipped.append((name, f"backend {name!r} is not gated (auto resolves per shape; reference is the ground truth)"))
            continue
        try:
            choice = dispatch.choose(op, *shape, dtype, device, name, heads)
        except (ValueError, TypeError) as err:
            skipped.append((name, str(err)))
            continue
        runnable.append((name, choice.variant))
    if "variants" in requested and not dispatch.variants(op):
        skipped.append(("variants", f"no Triton variants of {op} are registered"))
    return runnable, skipped


def _units(ops, shapes, dtypes, heads, rules):
    """(op, shape, dtype, RG-LRU heads, reason to skip or None) of every gate unit, dtype outermost
    (a run cut short keeps whole dtypes, and the first dtype listed matters most)."""
    for dtype in dtypes:
        for op in ops:
            for shape in shapes:
                D = shape[2]
                h = (heads or rglru_heads(D, int(rules.inputs["rglru_heads"]))) if op == "rglru" else 1
                reason = (f"SAMU needs an even D, got {shape}" if op == "samu" and D % 2 else
                          f"heads={h} does not divide D={D}" if D % h else None)
                yield op, tuple(shape), dtype, h, reason


def _inputs(op, shape, dtype, device, seed, heads, rules):
    B, L, D = shape
    s = derive_seed(seed, op, B, L, D, str(dtype).replace("torch.", ""))
    return make_inputs(op, shape, dtype, device, s, {**rules.inputs, "rglru_heads": heads})


def _warm_one(item) -> tuple:
    """One gate unit's backend run, for its compiled kernels only (a worker process of ``warm``)."""
    op, name, shape, dname, device, seed, heads = item
    start = time.perf_counter()
    try:
        inputs = _inputs(op, shape, getattr(torch, dname), device, seed, heads, load_rules())
        evaluate(op, inputs, backend=name)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        return item, time.perf_counter() - start, None
    except Exception as err:  # noqa: BLE001  (reported; the gate itself runs it again and records it)
        return item, time.perf_counter() - start, f"{type(err).__name__}: {err}"[:300]


def warm(ops, shapes, dtypes, backends, device, jobs: int, budget_s: float = 300.0, seed: int = 0,
         heads: "int | None" = None, progress: bool = True) -> list:
    """Compile every Triton variant's kernels for the gate units in ``jobs`` processes at once, so the
    gates that follow (one process, in order) find them in Triton's cache. Runs each unit's backend on
    the gate's own inputs, hence the same specialisation. Returns [(item, seconds, error or None)];
    units still running when ``budget_s`` is spent are reported as not compiled."""
    import multiprocessing as mp

    rules = load_rules()
    device = torch.device(device)
    items = []
    for op, shape, dtype, h, reason in _units(ops, shapes, dtypes, heads, rules):
        if reason is None:
            runnable, _ = resolve_backends(op, backends, shape, dtype, device, h)
            items += [(op, name, shape, str(dtype).replace("torch.", ""), str(device), seed, h)
                      for name, variant in runnable if variant is not None]
    if not items:
        return []
    done, deadline = [], time.perf_counter() + budget_s
    pool = mp.get_context("spawn").Pool(min(jobs, len(items)))
    try:
        results = pool.imap_unordered(_warm_one, items)
        for _ in tqdm(items, desc="warm-up", disable=not progress, dynamic_ncols=True):
            try:
                done.append(results.next(timeout=max(0.0, deadline - time.perf_counter())))
            except mp.TimeoutError:
                break
    finally:
        # a worker that hangs must not hold the gates
        pool.terminate()
    finished = {item for item, _, _ in done}
    return done + [(item, None, "not compiled within the warm-up budget") for item in items if item not in finished]


def run_gates(ops, shapes, dtypes, backends, device, seed: int = 0, progress: bool = True,
              command: str = "samu gate", out=None, heads: "int | None" = None) -> dict:
    """Run every gate asked for and return the record; with ``out``, the record is rewritten after
    every (op, shape, dtype), so a run stopped early keeps its finished rows (``complete`` false).
    ``heads``: RG-LRU's head count (default: gates.toml's, or the largest divisor of D below it)."""
    rules = load_rules()
    device = torch.device(device)
    record = new_record("gate", environment(device), command, gates_version=rules.version,
                        gates_file="samu/gates/gates.toml", skipped=[], complete=False)
    units = list(_units(ops, shapes, dtypes, heads, rules))
    bar = tqdm(units, desc="gates", disable=not progress, dynamic_ncols=True)
    for op, shape, dtype, heads_here, reason in bar:
        B, L, D = shape
        if reason is not None:
            entry = {"op": op, "backend": "*", "reason": reason}
            if entry not in record["skipped"]:
                record["skipped"].append(entry)
            continue
        dname = str(dtype).replace("torch.", "")
        runnable, skipped = resolve_backends(op, backends, shape, dtype, device, heads_here)
        for name, reason in skipped:
            entry = {"op": op, "backend": name, "reason": reason}
            if entry not in record["skipped"]:
                record["skipped"].append(entry)
                tqdm.write(f"skip {op} {name}: {reason}")
        if not runnable:
            continue
        bar.set_postfix_str(f"{op} {B}x{L}x{D} {dname} reference")
        s = derive_seed(seed, op, B, L, D, dname)
        inputs = _inputs(op, shape, dtype, device, seed, heads_here, rules)
        try:
            ref = evaluate(op, inputs, ref_dtype=torch.float64)
            serial = evaluate(op, inputs, ref_dtype=torch.float32)
        except Exception as err:  # noqa: BLE001  (e.g. out of memory: no reference, no gate; say so and go on)
            entry = {"op": op, "backend": "*", "shape": list(shape), "dtype": dname,
                     "reason": f"reference failed: {type(err).__name__}: {err}"[:500]}
            record["skipped"].append(entry)
            tqdm.write(f"skip {op} {B}x{L}x{D} {dname}: {entry['reason']}")
            inputs = None  # freed before the cache is emptied
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        serial_err = {q: rel_error(serial[q], ref[q]) for q in quantities(op)}
        del serial
        rounded_err = ({q: rel_error(ref[q].to(dtype), ref[q]) for q in rules.stored_in_io_dtype}
                       if dtype in LOW_PRECISION else {})
        baselines = {"serial_fp32": {q: _finite(v) for q, v in serial_err.items()},
                     "rounded_float64": {q: _finite(v) for q, v in rounded_err.items()}}
        for name, variant in runnable:
            bar.set_postfix_str(f"{op} {B}x{L}x{D} {dname} {name}")
            cls = (dispatch.gate_class(variant, B, L, D, heads_here, dtype) if variant is not None
                   else dispatch.shape_class(L, D, dtype))
            row = {"op": op, "backend": name, "variant": variant.name if variant is not None else name,
                   "shape": list(shape), "shape_class": cls, "dtype": dname, "seed": s, "baselines": baselines,
                   "heads": heads_here if op == "rglru" else None}
            start = time.perf_counter()
            try:
                row.update(judge(op, dtype, evaluate(op, inputs, backend=name), ref, serial_err, rounded_err, rules))
            except Exception as err:  # noqa: BLE001  (a backend that crashes fails its gate; the run goes on)
                row.update({"errors": {}, "thresholds": {}, "rules": {}, "passed": {}, "pass": False,
                            "exception": f"{type(err).__name__}: {err}"})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            row["seconds"] = round(time.perf_counter() - start, 3)
            record["rows"].append(row)
            failed = [q for q, ok in row["passed"].items() if not ok] or (["crashed"] if "exception" in row else [])
            tqdm.write(f"{'PASS' if row['pass'] else 'FAIL'} {op} {name} {B}x{L}x{D} {dname}"
                       + (f" ({', '.join(failed)})" if failed else ""))
        del ref, inputs
        end_unit(record, out, device)
    record["complete"] = True
    return record


def status_from_records(records: list, version: "int | None" = None) -> dict:
    """Dispatch status from gate records: (op, variant, shape class) is blocked when the newest row
    of any shape it was tested at failed. A pass at one shape never clears a failure at another;
    only a newer run of the same shape (or moving the failing record to quarantine) does. With
    ``version``, records written under another gates.toml version are left out."""
    latest: dict = {}
    for path, record in records:
        if record["kind"] != "gate" or (version is not None and record.get("gates_version") != version):
            continue
        stamp = (record["created"], path)
        for row in record["rows"]:
            unit = (row["op"], row["variant"], row["shape_class"], tuple(row.get("shape", ())))
            if unit not in latest or stamp > latest[unit][0]:
                latest[unit] = (stamp, [row])
            elif stamp == latest[unit][0]:
                latest[unit][1].append(row)
    keys = {unit[:3] for unit in latest}
    blocked_keys = sorted({unit[:3] for unit, (_, rows) in latest.items() if not all(r["pass"] for r in rows)})
    passed_keys = sorted(keys - set(blocked_keys))
    return {"blocked": [list(k) for k in blocked_keys], "passed": [list(k) for k in passed_keys],
            "sources": sorted({stamp[1] for stamp, _ in latest.values()})}


def update_status(results, extra: "list | None" = None, path: "Path | None" = None) -> tuple[Path, dict]:
    """Rebuild the status file from every non-quarantined gate record (plus ``extra``) and reload it."""
    records = load_records(results, kind="gate")
    records += [(p, r) for p, r in extra or [] if all(r != known for _, known in records)]
    status = status_from_records(records, load_rules().version)
    path = Path(path) if path else status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n")
    reload()
    return path, status


def gate_command(args) -> int:
    """Entry of ``samu gate`` (argparse namespace from samu.bench.cli)."""
    status_file = Path(args.status) if args.status else None
    if args.status_only:
        path, status = update_status(args.results, path=status_file)
        print(f"status: {path} ({len(status['blocked'])} blocked, {len(status['passed'])} passed)")
        return 0
    if args.jobs > 1:
        warmed = warm(args.ops, args.shapes, args.dtypes, args.backends, args.device, args.jobs,
                      args.warm_budget, args.seed, args.heads, progress=not args.quiet)
        errors = [(item, err) for item, _, err in warmed if err]
        print(f"warm-up: {len(warmed)} units in {args.jobs} processes, {len(errors)} with errors"
              + "".join(f"\n  {item[0]} {item[1]} {item[2]} {item[3]}: {err}" for item, err in errors))
    record = run_gates(args.ops, args.shapes, args.dtypes, args.backends, args.device, seed=args.seed,
                       progress=not args.quiet, command=args.command_line, out=args.out, heads=args.heads)
    out = write_record(record, args.out)
    print(f"record: {out}")
    failed = [r for r in record["rows"] if not r["pass"]]
    print(f"{len(record['rows']) - len(failed)} passed, {len(failed)} failed")
    if not args.no_status:
        path, status = update_status(args.results, extra=[(out.as_posix(), record)], path=status_file)
        print(f"status: {path} ({len(status['blocked'])} blocked)")
    return 1 if failed and args.strict else 0
