"""``samu bench``: time every scope x shape with its candidates side by side and write one record."""

from __future__ import annotations

import math

import torch
from tqdm import tqdm

from samu.bench import peers
from samu.bench.records import (ResumeRefused, end_unit, flagged, holding_run_lock, is_int, is_names, is_shape,
                                is_shapes, new_record, resumable, write_record)
from samu.environment import environment
from samu.bench.peer_models import MODEL_PEERS
from samu.bench.scopes import (MIXER_SCOPES, MODULE_IMPLS, OPS, PEER_IMPLS, SCOPES, memory_floor, mixer_candidates,
                               module_candidate)
from samu.bench.shapes import shape_str
from samu.bench.timing import (SAMPLES, WARMUP, Clock, copy_bandwidth, count_launches, peak_memory,
                               time_side_by_side)
from samu.gates.inputs import derive_seed
from samu.gates.rules import LOW_PRECISION, load_rules, rel_error
from samu.ops import dispatch
from samu.ops.checks import set_check_finite


def impls_for(op: str, impls: list[str], with_peers) -> list[str]:
    """Our candidates (``variants`` expands to every registered Triton variant), then the peers of
    ``op`` among ``with_peers`` (True: all of PEER_IMPLS, False: none, or a list of names)."""
    out: list[str] = []
    for item in impls:
        for impl in (sorted(dispatch.variants(op)) if item == "variants" else [item]):
            if impl not in out:
                out.append(impl)
    wanted = PEER_IMPLS if with_peers is True else (with_peers or ())
    out += [p for p in ("torch", *peers.peers_of(op)) if p in wanted and p not in out]
    return out


def module_impls(scope: str, impls) -> list[str]:
    """How the block, step and model scopes run their modules: the MODULE_IMPLS among ``impls`` (eager,
    "auto", when none is), and in the block scope its GEMMs alone ("gemm") beside them."""
    out = [i for i in impls if i in MODULE_IMPLS and i != "gemm"] or ["auto"]
    return out + ["gemm"] if scope == "block" else out


def _candidates(scope, shape, dtype, device, impls, with_peers, seed, preset):
    found, skipped = [], []
    model_peers = [p for p in MODEL_PEERS if scope == "model" and (with_peers is True or p in (with_peers or ()))]
    for op in OPS + tuple(model_peers):
        if op == "samu" and shape[2] % 2:
            skipped.append((f"{op}/*", "SAMU needs an even D"))
            continue
        s = derive_seed(seed, "bench", op, *shape)
        if scope in MIXER_SCOPES:
            c, sk = mixer_candidates(scope, op, impls_for(op, impls, with_peers), shape, dtype, device, s)
            found += c
            skipped += [(k.name, k.reason) for k in sk]
            continue
        for impl in module_impls(scope, impls):
            c, sk = module_candidate(scope, op, shape, dtype, device, s, preset, impl)
            found += [c] if c is not None else []
            skipped += [(k.name, k.reason) for k in sk]
    return found, skipped


def agreement_threshold(dtype: torch.dtype) -> float:
    """The largest relative y difference two results that pass the low-precision gate of y can have.

    The gate (spec §7) allows each result r = low_factor * rho + low_floor of the float64 truth T,
    rho being the error of T rounded to the I/O dtype. At benchmark sizes there is no T, so rho takes
    its bound, the dtype's unit roundoff eps / 2 (rounding to nearest moves no normal number further).
    Both within r of T: |peer - samu| <= 2 r |T| <= 2 r / (1 - r) |samu|. A peer beyond that is not
    within the gate wherever samu's dispatched op is. fp32 I/O has no such rule (its rule needs the
    serial fp32 error, i.e. T): it takes bf16's, far above any correct fp32 result's error, so it
    flags only a peer that computes something else.
    """
    low = dtype if dtype in LOW_PRECISION else torch.bfloat16
    r, _ = load_rules().threshold("y", low, 0.0, torch.finfo(low).eps / 2)
    return 2 * r / (1 - r)


def _agreement(candidates, dtype) -> dict:
    """Each candidate's y (and dx, with a backward) against its op's dispatched candidate's, on the timed inputs
    after the timing (mixer scopes); ``flagged`` when either difference passes ``agreement_threshold`` (dx is
    stored in the I/O dtype under the same rule as y); ``rel_error`` is the larger."""
    limit = agreement_threshold(dtype)
    out = {}
    for op in OPS:
        base = next((c for c in candidates if c.op == op and c.impl == "auto" and c.output), None)
        if base is None:
            continue
        want = base.output()
        for c in candidates:
            if c.op == op and c is not base and c.output is not None:
                got = c.output()
                errs = {q: rel_error(got[q], want[q]) for q in want}
                finite = all(math.isfinite(e) for e in errs.values())
                err = max(errs.values())
                out[c.name] = {"against": base.name, "rel_error": err if finite else None, "threshold": limit,
                               "flagged": not (finite and err <= limit),
                               "rel_errors": {q: (e if math.isfinite(e) else None) for q, e in errs.items()}}
                del got
        del want
    return out


def _run_arguments(record: dict) -> tuple:
    """(scopes, shapes, dtype, impls, with_peers, warmup, samples, seed, preset, check_finite) of the run a bench
    record keeps (``arguments``)."""
    given = record["arguments"]
    return (given["scopes"], [tuple(s) for s in given["shapes"]], getattr(torch, given["dtype"]), given["impls"],
            given["peers"], given["warmup"], given["samples"], given["seed"], given["preset"], given["check_finite"])


def _unreadable(record: dict) -> list[str]:
    """Why a bench record's run cannot be taken up from it as it is written (records.resumable's ``problems``): each
    argument of the kind the command line gives, the finished units, and the copy bandwidth."""
    given = record["arguments"]
    kinds = {"scopes": is_names(given.get("scopes"), SCOPES), "shapes": is_shapes(given.get("shapes")),
             "dtype": isinstance(getattr(torch, str(given.get("dtype")), None), torch.dtype),
             "impls": is_names(given.get("impls")),
             "peers": isinstance(given.get("peers"), bool) or is_names(given.get("peers")),
             "warmup": is_int(given.get("warmup"), WARMUP), "samples": is_int(given.get("samples"), SAMPLES),
             "seed": is_int(given.get("seed"), -2 ** 63), "preset": isinstance(given.get("preset"), str),
             "check_finite": isinstance(given.get("check_finite"), bool),
             "units_done": all(isinstance(u, list) and len(u) == 2 and u[0] in SCOPES and is_shape(u[1])
                               for u in record["units_done"])}
    problems = [f"{k} cannot be read back" for k, ok in kinds.items() if not ok]
    bandwidth = record.get("copy_bandwidth")
    rate = bandwidth.get("bytes_per_s") if isinstance(bandwidth, dict) else None
    if not (isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0):
        problems.append("copy_bandwidth cannot be read back")
    return problems + [f"{k} is not a list" for k in ("skipped", "failed") if not isinstance(record.get(k), list)]


def resumable_record(path, device, command: str) -> dict:
    """The bench record at ``path``, to be continued on ``device`` by ``command`` (run_bench's ``resume``):
    records.resumable's record of an unfinished run of this code and machine, or ResumeRefused naming --resume."""
    return resumable(path, "bench", environment(device), command, _unreadable)


def _time_unit(record, scope, shape, ready, dtype, dname, device, clock, warmup, samples) -> None:
    """The rows of one unit's candidates that ran once, timed side by side (each with its memory, launches, floor
    and agreement), into ``record``."""
    bandwidth = record["copy_bandwidth"]["bytes_per_s"]
    timings = time_side_by_side({c.name: c.run for c in ready}, clock, warmup=warmup, samples=samples)
    # packed candidates compute other sequences than the unpacked one: nothing to agree with
    agreement = _agreement(ready, dtype) if scope in ("fwd", "fb") else {}
    for name, a in agreement.items():
        if a["flagged"]:
            errors = a["rel_errors"]
            worst = max(errors, key=lambda q: math.inf if errors[q] is None else errors[q])
            tqdm.write(f"flagged {name} {scope} {shape_str(shape)}: {worst} differs from {a['against']}'s by "
                       f"{a['rel_error'] or math.inf:.2e} > {a['threshold']:.2e}; it is not ranked")
    floor_formula, floor_bytes = memory_floor(scope, shape, dtype)
    floor_ms = floor_bytes / bandwidth * 1e3 if floor_bytes else None
    for position, c in enumerate(ready):
        t = timings[c.name]
        memory = peak_memory(c.run, device) or {}
        # launch counts are for samu's own ops; profiling a peer's thousands of launches costs seconds
        launches = None if c.peer else count_launches(c.run, device)
        record["rows"].append({
            "scope": scope, "op": c.op, "impl": c.impl, "candidate": c.name, "peer": c.peer,
            "shape": list(shape), "dtype": dname, "order": position,
            "median_ms": t.median_ms, "round_medians_ms": t.round_medians_ms, "samples_ms": t.samples_ms,
            "peak_alloc": memory.get("peak_alloc"), "peak_reserved": memory.get("peak_reserved"),
            "launches": launches, "params": c.params,
            "choice": c.choice, "choice_reason": c.choice_reason,
            "scratch_formula": c.scratch[0], "scratch_bytes": c.scratch[1],
            "floor_formula": floor_formula, "floor_bytes": floor_bytes, "floor_ms": floor_ms,
            "floor_ratio": t.median_ms / floor_ms if floor_ms else None,
            "agreement": agreement.get(c.name), **(c.extra or {}),
        })


def _bench_units(record, scopes, shapes, dtype, dname, device, clock, impls, with_peers, warmup, samples, seed, preset,
                 progress, out) -> dict:
    finished = {(scope, tuple(shape)) for scope, shape in record["units_done"]}
    units = [(scope, tuple(shape)) for shape in shapes for scope in scopes]
    bar = tqdm(units, desc="bench", disable=not progress, dynamic_ncols=True)
    announced = set()
    for scope, shape in bar:
        if (scope, shape) in finished:
            continue
        bar.set_postfix_str(f"{scope} {shape_str(shape)}")
        candidates, skipped = _candidates(scope, shape, dtype, device, list(impls), with_peers, seed, preset)
        for name, reason in skipped:
            record["skipped"].append({"scope": scope, "shape": list(shape), "candidate": name, "reason": reason})
            if (name, reason) not in announced:
                announced.add((name, reason))
                tqdm.write(f"skip {name}: {reason}")
        # one untimed call each: compilation and autotuning happen here, failures drop out
        ready = []
        for c in candidates:
            try:
                c.run()
                ready.append(c)
            except Exception as err:  # noqa: BLE001  (one failing candidate must not end the run)
                record["failed"].append({"scope": scope, "shape": list(shape), "candidate": c.name,
                                         "error": f"{type(err).__name__}: {err}"[:2000]})
                tqdm.write(f"FAILED {c.name} {scope} {shape_str(shape)}: {type(err).__name__}: {err}"[:400])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if ready:
            _time_unit(record, scope, shape, ready, dtype, dname, device, clock, warmup, samples)
        del candidates, ready
        record["units_done"].append([scope, list(shape)])
        end_unit(record, out, device)
    record["complete"] = True
    if out is not None:
        write_record(record, out)
    return record


def _run_bench(scopes, shapes, dtype, device, impls, with_peers, warmup, samples, seed, preset, progress, command,
               out, check_finite, resume) -> dict:
    for scope in scopes:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    clock = Clock(device)
    dname = str(dtype).replace("torch.", "")
    if resume is not None:
        record = resume
        record["resumed"][-1]["copy_bandwidth"] = copy_bandwidth(device, clock)
    else:
        arguments = {"scopes": list(scopes), "shapes": [list(s) for s in shapes], "dtype": dname,
                     "impls": list(impls), "peers": with_peers if isinstance(with_peers, bool) else list(with_peers),
                     "warmup": warmup, "samples": samples, "seed": seed, "preset": preset,
                     "check_finite": check_finite}
        record = new_record("bench", environment(device), command, copy_bandwidth=copy_bandwidth(device, clock),
                            timing={**clock.describe(), "warmup": warmup, "samples": samples, "rounds": 2,
                                    "check_finite": check_finite},
                            skipped=[], failed=[], complete=False, arguments=arguments, units_done=[])
    with holding_run_lock(record, resumed=resume is not None, path=out):
        if out is not None:
            # written before the first unit too, so a run stopped there still leaves a record (complete: false)
            write_record(record, out)
        return _bench_units(record, scopes, shapes, dtype, dname, device, clock, impls, with_peers, warmup, samples,
                            seed, preset, progress, out)


def run_bench(scopes, shapes, dtype, device, impls=("auto",), with_peers=True, warmup=3, samples=5,
              seed=0, preset="400m", progress=True, command="samu bench", out=None, check_finite=False,
              resume=None) -> dict:
    """Run the bench and return its record; with ``out``, the record is rewritten after every unit,
    so a run stopped early still leaves its finished rows (``complete`` stays false), with the run's arguments and
    the units it finished.

    ``check_finite``: keep samu's per-call parameter finiteness check (a host sync and a few small
    kernels per call; off by default, as in a compiled or tuned training loop, and recorded).
    ``resume``: the record of a run cut short (resumable_record), which this run continues with its own
    ``arguments`` (those given here are not used): it keeps its rows and times no unit it finished again. Its floor
    ratios keep the copy bandwidth of the run's start; this session's is noted with the resumption.
    """
    if resume is not None:
        scopes, shapes, dtype, impls, with_peers, warmup, samples, seed, preset, check_finite = _run_arguments(resume)
    previous = set_check_finite(check_finite)
    try:
        return _run_bench(scopes, shapes, dtype, torch.device(device), impls, with_peers, warmup, samples, seed,
                          preset, progress, command, out, check_finite, resume)
    finally:
        set_check_finite(previous)


def summary(record: dict) -> str:
    """A short fixed-width table of a bench record, for the end of a run."""
    lines = [f"{'scope':6} {'shape':16} {'candidate':26} {'median ms':>10} {'x floor':>8} {'launches':>8}"]
    for r in record["rows"]:
        # a candidate whose output disagrees with samu's is no alternative at any speed
        ratio = "flagged" if flagged(r) else f"{r['floor_ratio']:.1f}" if r["floor_ratio"] else "-"
        launches = str(r["launches"]["total"]) if r["launches"] else "-"
        lines.append(f"{r['scope']:6} {shape_str(r['shape']):16} {r['candidate']:26} {r['median_ms']:10.3f} "
                     f"{ratio:>8} {launches:>8}")
    return "\n".join(lines)


def bench_command(args) -> int:
    """Entry of ``samu bench`` (argparse namespace from samu.bench.cli); with ``args.resume``, the run of that record
    goes on in it (resumable_record; the command line's other options were refused by the CLI)."""
    out_path = args.resume if args.resume is not None else args.out
    try:
        resume = None if args.resume is None else resumable_record(args.resume, args.device, args.command_line)
        record = run_bench(args.scopes, args.shapes, args.dtype, args.device, impls=args.impls,
                           with_peers=args.peers, warmup=args.warmup, samples=args.samples, seed=args.seed,
                           preset=args.preset, progress=not args.quiet, command=args.command_line, out=out_path,
                           check_finite=args.check_finite, resume=resume)
    except ResumeRefused as err:
        raise SystemExit(f"samu bench: error: {err}") from None
    out = write_record(record, out_path)
    print(summary(record))
    print(f"record: {out} ({len(record['rows'])} rows, {len(record['skipped'])} skipped, "
          f"{len(record['failed'])} failed)")
    return 1 if record["failed"] and args.strict else 0
