"""``samu gate``: run the spec §7 gates, write pass/fail records, keep dispatch's status current.

For each (op, shape, dtype) the float64 serial reference and the serial fp32 evaluation run once
on the same inputs; each backend is then compared with the reference for the output, the final
state, the input gradient, the initial-state gradient and every parameter gradient; and again, named
``<result>|no_final``, for the call a caller that drops the final state makes: a forward without it and a
backward of y's cotangent alone, which the kernels compile apart; and, named ``<result>|no_state``, for the call
training makes, without an initial state as well (compiled apart again). On CUDA the units run in a
worker process, so a kernel fault fails its own row and the run goes on in a fresh one.

With ``documents`` = N, each unit of a batch-1 shape packs N sequences (samu.ops.packing; the first one
token long, the others cut at random), each with its own initial and final state: the reference runs
each sequence alone, the backend the packed call. Packed rows carry ``documents`` and ``cu_seqlens``
and speak for packed classes (dispatch.shape_class's ``packed``), which dispatch consults for packed
calls only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import torch
from tqdm import tqdm

from samu import reference
from samu.bench.records import (ResumeRefused, end_unit, holding_run_lock, is_int, is_names, is_shape, is_shapes,
                                 load_records, new_record, resumable, same_run, write_record)
from samu.environment import environment
from samu.ops import gate_status
from samu.ops.gate_status import reload, status_path
from samu.gates.inputs import PARAMS, RGLRU_C, derive_seed, document_offsets, make_inputs, pack_inputs, rglru_heads
from samu.gates.rules import LOW_PRECISION, NO_FINAL, NO_STATE, base_quantity, load_rules, rel_error
from samu.ops import dispatch
from samu.ops.functional import rglru_mixer, samu_mixer
from samu.paths import FileLock

RADIAL_BOUND = 2.0


# a float64 reference that ran out of GPU memory is tried this many times, waiting 10 s, 20 s, ...
REFERENCE_ATTEMPTS = 4
REFERENCE_RETRY_S = 10.0

def quantities(op: str, all_forms: bool = False) -> tuple:
    """The results a gate compares: the outputs and every gradient; ``all_forms``: also those of the call that
    drops the final state (named with NO_FINAL) and of the call without either state (NO_STATE)."""
    names = ("y", "final_state", "dx", "d_initial_state") + tuple(f"d_{p}" for p in PARAMS[op])
    if not all_forms:
        return names
    return (names + tuple(q + NO_FINAL for q in names if q != "final_state")
            + tuple(q + NO_STATE for q in names if q not in ("final_state", "d_initial_state")))


def evaluate(op: str, inputs: dict, *, backend: "str | None" = None, ref_dtype: "torch.dtype | None" = None,
             run=None, all_forms: bool = False) -> dict:
    """One forward and backward: {quantity: tensor}. ``ref_dtype`` runs the serial reference in
    that dtype on the same (already rounded) inputs; otherwise the public op with ``backend``, or
    ``run``, a callable with the public op's signature (the tests' own configurations). An
    ``initial_state`` of None runs without one (no d_initial_state). Packed inputs (``cu_seqlens``,
    pack_inputs) run the reference one sequence at a time and the op packed. ``all_forms`` (the gates' inputs:
    an initial state and a "dh"): the NO_FINAL results too, of the call that drops the final state (a forward
    without it, the reference's being the same forward, and a backward of y's cotangent alone), and the NO_STATE
    results of the call without either state, training's."""
    if all_forms and (inputs["initial_state"] is None or inputs["dh"] is None):
        raise ValueError("all_forms: the inputs need an initial state and a final-state cotangent (the gates' own)")
    cast = (lambda t: t.to(ref_dtype)) if ref_dtype is not None else (lambda t: t.clone())
    x = cast(inputs["x"]).requires_grad_()
    params = [cast(p).requires_grad_() for p in inputs["params"].values()]
    h0 = None if inputs["initial_state"] is None else cast(inputs["initial_state"]).requires_grad_()
    cu_seqlens = inputs.get("cu_seqlens")
    if ref_dtype is not None:
        fn = reference.samu_mixer if op == "samu" else reference.rglru_mixer
        kw = {"dtype": ref_dtype}
    elif run is not None:
        fn, kw = run, {}
    else:
        fn, kw = (samu_mixer if op == "samu" else rglru_mixer), {"backend": backend}
    if cu_seqlens is not None:
        kw["cu_seqlens"] = cu_seqlens
    if run is None:
        kw.update({"radial_bound": RADIAL_BOUND} if op == "samu" else {"c": RGLRU_C})
    y, h = fn(x, *params, initial_state=h0, output_final_state=True, **kw)
    leaves = [x] + ([h0] if h0 is not None else []) + params
    # a "dh" of None leaves the final state out of the loss (its cotangent is then no tensor at all)
    outs, cots = ([y], [inputs["dy"].to(y.dtype)]) if inputs["dh"] is None else (
        [y, h], [inputs["dy"].to(y.dtype), inputs["dh"].to(h.dtype)])
    grads = torch.autograd.grad(outs, leaves, cots, retain_graph=all_forms and ref_dtype is not None)
    names = [q for q in quantities(op) if h0 is not None or q != "d_initial_state"]
    out = dict(zip(names, (y.detach(), h.detach(), *grads)))
    if all_forms:
        if ref_dtype is None:
            # no final state asked for, and no cotangent (not even a zero one) reaching it
            y, _ = fn(x, *params, initial_state=h0, output_final_state=False, **kw)
        out[f"y{NO_FINAL}"] = y.detach()
        out.update(zip([q + NO_FINAL for q in names[2:]], torch.autograd.grad([y], leaves, cots[:1])))
        # the call training makes: no initial state, no final state
        y, _ = fn(x, *params, initial_state=None, output_final_state=ref_dtype is not None, **kw)
        out[f"y{NO_STATE}"] = y.detach()
        out.update(zip([q + NO_STATE for q in names[2:] if q != "d_initial_state"],
                       torch.autograd.grad([y], [x] + params, cots[:1])))
    return out


def baselines(ref: dict, serial: dict, dtype: torch.dtype, rules) -> tuple[dict, dict]:
    """What the thresholds scale: the serial fp32 evaluation's error of every result, and (bf16 /
    fp16 I/O) the error of the float64 results stored in that dtype, rounded to it."""
    serial_err = {q: rel_error(serial[q], ref[q]) for q in ref}
    rounded_err = ({q: rel_error(ref[q].to(dtype), ref[q]) for q in ref
                    if base_quantity(q) in rules.stored_in_io_dtype} if dtype in LOW_PRECISION else {})
    return serial_err, rounded_err


def _finite(value: float) -> "float | None":
    return value if math.isfinite(value) else None


def judge(op: str, dtype: torch.dtype, out: dict, ref: dict, serial_err: dict, rounded_err: dict, rules) -> dict:
    """Errors, thresholds and pass/fail of one backend's results (every quantity of ``ref``) against
    the reference."""
    errors, thresholds, rule_names, passed = {}, {}, {}, {}
    for q in ref:
        err = rel_error(out[q], ref[q])
        base = serial_err[q]
        rounded = rounded_err.get(q)
        limit, rule = rules.threshold(q, dtype, base, rounded)
        errors[q], thresholds[q], rule_names[q] = _finite(err), _finite(limit), rule
        passed[q] = math.isfinite(err) and math.isfinite(limit) and err <= limit
    return {"errors": errors, "thresholds": thresholds, "rules": rule_names, "passed": passed,
            "pass": all(passed.values())}


def resolve_backends(op: str, requested: list[str], shape, dtype, device, heads: int = 16,
                     packed: bool = False) -> tuple[list, list]:
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
            choice = dispatch.choose(op, *shape, dtype, device, name, heads, packed=packed)
        except (ValueError, TypeError) as err:
            skipped.append((name, str(err)))
            continue
        if choice.backend == "per_sequence":
            # one call per sequence through the unpacked classes: nothing a packed gate could speak for
            skipped.append((name, f"packed calls of {name} run one call per sequence ({choice.reason})"))
            continue
        runnable.append((name, choice.variant))
    if "variants" in requested and not dispatch.variants(op):
        skipped.append(("variants", f"no Triton variants of {op} are registered"))
    return runnable, skipped


def _units(ops, shapes, dtypes, heads, rules, documents=None):
    """(op, shape, dtype, RG-LRU heads, reason to skip or None) of every gate unit, dtype outermost
    (a run cut short keeps whole dtypes, and the first dtype listed matters most)."""
    for dtype in dtypes:
        for op in ops:
            for shape in shapes:
                B, L, D = shape
                h = (heads or rglru_heads(D, int(rules.inputs["rglru_heads"]))) if op == "rglru" else 1
                reason = (f"SAMU needs an even D, got {shape}" if op == "samu" and D % 2 else
                          f"heads={h} does not divide D={D}" if D % h else
                          f"documents={documents} packs a batch-1 shape of L >= {documents}, got {shape}"
                          if documents is not None and (B != 1 or L < documents) else None)
                yield op, tuple(shape), dtype, h, reason


def _inputs(op, shape, dtype, device, seed, heads, rules, documents=None):
    B, L, D = shape
    s = derive_seed(seed, op, B, L, D, str(dtype).replace("torch.", ""))
    inputs = make_inputs(op, shape, dtype, device, s, {**rules.inputs, "rglru_heads": heads})
    if documents is None:
        return inputs
    s = derive_seed(seed, op, B, L, D, str(dtype).replace("torch.", ""), "documents", documents)
    return pack_inputs(inputs, document_offsets(L, documents, s), s)


def _warm_one(item) -> tuple:
    """One gate unit's backend run, for its compiled kernels only (a worker process of ``warm``)."""
    op, name, shape, dname, device, seed, heads = item
    start = time.perf_counter()
    try:
        inputs = _inputs(op, shape, getattr(torch, dname), device, seed, heads, load_rules())
        evaluate(op, inputs, backend=name, all_forms=True)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        return item, time.perf_counter() - start, None
    except Exception as err:  # noqa: BLE001  (reported; the gate itself runs it again and records it)
        return item, time.perf_counter() - start, f"{type(err).__name__}: {err}"[:300]


def warm(ops, shapes, dtypes, backends, device, jobs: int, budget_s: float = 300.0, seed: int = 0,
         heads: "int | None" = None, progress: bool = True) -> list:
    """Compile every Triton variant's kernels for the gate units in ``jobs`` processes at once, so the
    gates that follow (in order, one unit at a time) find them in Triton's cache. Runs each unit's backend on
    the gate's own inputs, hence the same specialisation. Returns [(item, seconds, error or None)];
    units still running when ``budget_s`` is spent are reported as not compiled."""
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


def _failed(row: dict, error: str) -> dict:
    """``row`` (its header: op, variant, shape, class) as the failed row of a backend that raised or
    took its process down; status_from_records blocks its class like any other failure."""
    return {**row, "errors": {}, "thresholds": {}, "rules": {}, "passed": {}, "pass": False, "exception": error}


def _sync(device: torch.device) -> None:
    # a kernel fault surfaces at the next synchronisation: here, inside the try of its own backend
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _context_lost(device: torch.device) -> "str | None":
    """After an error on CUDA: None when the context still works, else the error saying it does not.
    A sticky fault (illegal address, misaligned access, device-side assert) fails every later CUDA
    call of the process, so one small op and a synchronize find it; an out-of-memory or a launch the
    driver refused leaves the context usable, and gating goes on without a fresh process (a torch
    import, a CUDA context and the unit's reference again)."""
    if device.type != "cuda":
        return None
    try:
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001  (any failure here means the context is gone)
        return f"{type(err).__name__}: {err}"[:500]
    return None


def gate_unit(op: str, shape, dtype: torch.dtype, heads: int, backends: list, device, seed: int = 0,
              rules=None, done=(), documents=None):
    """Gate one (op, shape, dtype) unit, yielding events as it goes: ("skip", entry) for what cannot
    run, ("reference", None) before the float64 and serial fp32 evaluations, ("start", row header)
    before each backend and ("row", row) after it; when an error left the CUDA context unusable,
    ("lost", error) is the last event. ``done``: backend names already gated (a fresh worker resuming
    the unit). The one code path of a gate, in process and in run_gates' worker."""
    rules = rules or load_rules()
    device = torch.device(device)
    B, L, D = shape
    dname = str(dtype).replace("torch.", "")
    runnable, unrunnable = resolve_backends(op, backends, shape, dtype, device, heads, documents is not None)
    for name, reason in unrunnable:
        yield "skip", {"op": op, "backend": name, "reason": reason}
    runnable = [(name, variant) for name, variant in runnable if name not in done]
    if not runnable:
        return
    yield "reference", None
    s = derive_seed(seed, op, B, L, D, dname)
    failure = None
    # out of memory while other processes share the GPU: free what this one cached and try again
    for attempt in range(REFERENCE_ATTEMPTS):
        try:
            inputs = _inputs(op, shape, dtype, device, seed, heads, rules, documents)
            ref = evaluate(op, inputs, ref_dtype=torch.float64, all_forms=True)
            serial = evaluate(op, inputs, ref_dtype=torch.float32, all_forms=True)
            _sync(device)
            failure = None
            break
        except torch.OutOfMemoryError as err:
            failure = f"reference failed: {type(err).__name__}: {err}"[:500]
            inputs = ref = serial = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            time.sleep(REFERENCE_RETRY_S * (attempt + 1))
        except Exception as err:  # noqa: BLE001  (no reference, no gate; say so and go on)
            failure = f"reference failed: {type(err).__name__}: {err}"[:500]
            break
    if failure is not None:
        inputs = ref = serial = None  # freed before the cache is emptied
        yield "skip", {"op": op, "backend": "*", "shape": list(shape), "dtype": dname, "reason": failure}
        lost = _context_lost(device)
        if lost:
            yield "lost", lost
        elif device.type == "cuda":
            torch.cuda.empty_cache()
        return
    serial_err, rounded_err = baselines(ref, serial, dtype, rules)
    del serial
    recorded = {"serial_fp32": {q: _finite(v) for q, v in serial_err.items()},
                "rounded_float64": {q: _finite(v) for q, v in rounded_err.items()}}
    for name, variant in runnable:
        packed = documents is not None
        cls = (dispatch.gate_class(variant, B, L, D, heads, dtype, packed) if variant is not None
               else dispatch.shape_class(L, D, dtype, packed=packed))
        row = {"op": op, "backend": name, "variant": variant.name if variant is not None else name,
               "shape": list(shape), "shape_class": cls, "dtype": dname, "seed": s, "baselines": recorded,
               "heads": heads if op == "rglru" else None}
        if documents is not None:
            row.update(documents=documents, cu_seqlens=inputs["cu_seqlens"].tolist())
        yield "start", dict(row)
        start, lost = time.perf_counter(), None
        try:
            out = evaluate(op, inputs, backend=name, all_forms=True)
            _sync(device)
            row.update(judge(op, dtype, out, ref, serial_err, rounded_err, rules))
        except Exception as err:  # noqa: BLE001  (a backend that crashes fails its gate; the run goes on)
            row = _failed(row, f"{type(err).__name__}: {err}")
            lost = _context_lost(device)
        # freed before the next backend runs, or the cache is emptied
        out = None
        if "exception" in row and not lost and device.type == "cuda":
            torch.cuda.empty_cache()
        row["seconds"] = round(time.perf_counter() - start, 3)
        yield "row", row
        if lost:
            yield "lost", lost
            return


def _serve(conn, device: str, preload: tuple) -> None:
    """run_gates' worker process: gates each unit it receives (gate_unit's keyword arguments), sending
    every event back and ("done", None) after the unit, until it receives None."""
    for module in preload:
        importlib.import_module(module)
    rules = load_rules()
    while (unit := conn.recv()) is not None:
        for event in gate_unit(**unit, device=device, rules=rules):
            conn.send(event)
            if event[0] == "lost":
                # a faulted context can be neither reused nor always torn down cleanly: leave at once
                conn.close()
                os._exit(0)
        conn.send(("done", None))


class _Worker:
    """The child process run_gates gates in (spawned, so it starts with a CUDA context of its own);
    started when a unit needs it, and again after it died or left with a lost context."""

    def __init__(self, device, preload=()):
        self.device, self.preload = str(device), tuple(preload)
        self.process = self.conn = None
        self.busy = False

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, self.device, self.preload), daemon=True,
                                   name="samu-gate-worker")
        self.process.start()
        # the parent holds no handle on the child's end, so the child's exit reads as EOF here
        child.close()

    def _reap(self) -> str:
        """Wait for the child that closed its end; the words for how it ended."""
        self.conn.close()
        self.process.join(60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        code = self.process.exitcode
        self.process = self.conn = None
        try:
            signame = f" ({signal.Signals(-code).name})" if code < 0 else ""
        except ValueError:
            signame = ""
        return f"worker process died with exit code {code}{signame}"

    def gate(self, **unit):
        """gate_unit's events for ``unit``, gated in the child. A child that dies without reporting
        (a segfault, os._exit, a kill) fails the backend it was running, and a fresh child resumes
        the unit after it; a death in the reference skips the unit, as a reference that raises does."""
        done, self.busy = list(unit.pop("done", ())), True
        shape, dname = list(unit["shape"]), str(unit["dtype"]).replace("torch.", "")
        while True:
            if self.process is None:
                self._start()
            # what the child was doing when it died: None (not started), "reference", the header of
            # the backend it was running, "resume" (between backends) or "over" (no reference)
            state, started = None, time.perf_counter()
            try:
                self.conn.send({**unit, "done": tuple(done)})
                while (event := self.conn.recv())[0] != "done":
                    kind, payload = event
                    if kind in ("reference", "start"):
                        state, started = payload or "reference", time.perf_counter()
                    elif kind == "row":
                        done.append(payload["backend"])
                        state = "resume"
                    elif kind == "skip" and payload["backend"] == "*":
                        state = "over"
                    yield event
                self.busy = False
                return
            except (EOFError, OSError):
                death = self._reap()
            if isinstance(state, dict):
                row = _failed(state, f"{death} while running {state['backend']}")
                row["seconds"] = round(time.perf_counter() - started, 3)
                done.append(row["backend"])
                yield "row", row
                continue
            if state == "resume":
                continue
            if state == "reference":
                yield "skip", {"op": unit["op"], "backend": "*", "shape": shape, "dtype": dname,
                               "reason": f"reference failed: {death} while running the reference"}
            elif state is None:
                # it died before reporting anything: a fresh one would likely too, so the unit ends
                yield "skip", {"op": unit["op"], "backend": "*", "shape": shape, "dtype": dname,
                               "reason": f"{death} before gating"}
            self.busy = False
            return

    def close(self) -> None:
        """Let an idle child finish; kill one cut off in the middle of a unit."""
        if self.process is None:
            return
        if not self.busy:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
        self.process = self.conn = None


def _run_arguments(record: dict) -> tuple:
    """(ops, shapes, dtypes, backends, seed, heads, documents) of the run a gate record keeps (``arguments``)."""
    given = record["arguments"]
    return (given["ops"], [tuple(s) for s in given["shapes"]], [getattr(torch, d) for d in given["dtypes"]],
            given["backends"], given["seed"], given["heads"], given["documents"])


def _unreadable(record: dict) -> list[str]:
    """Why a gate record's run cannot be taken up from it as it is written (records.resumable's ``problems``): each
    argument of the kind the command line gives, and the finished units."""
    given = record["arguments"]
    dtype_names = given.get("dtypes")
    kinds = {"ops": is_names(given.get("ops"), ("samu", "rglru")), "shapes": is_shapes(given.get("shapes")),
             "dtypes": is_names(dtype_names) and all(isinstance(getattr(torch, d, None), torch.dtype)
                                                     for d in dtype_names),
             "backends": is_names(given.get("backends")), "seed": is_int(given.get("seed"), -2 ** 63),
             "heads": given.get("heads") is None or is_int(given.get("heads"), 1),
             "documents": given.get("documents") is None or is_int(given.get("documents"), 1),
             "units_done": all(isinstance(u, list) and len(u) == 3 and u[0] in ("samu", "rglru") and is_shape(u[1])
                               and isinstance(u[2], str) for u in record["units_done"])}
    return ([f"{k} cannot be read back" for k, ok in kinds.items() if not ok]
            + ([] if isinstance(record.get("skipped"), list) else ["skipped is not a list"]))


def resumable_record(path, device, command: str) -> dict:
    """The gate record at ``path``, to be continued on ``device`` by ``command`` (run_gates' ``resume``, with the
    record's own ``arguments``): records.resumable's record of an unfinished run of this code and machine, made under
    this gates.toml, or ResumeRefused naming --resume. Notes the resumption in the record."""
    record = resumable(path, "gate", environment(device), command, _unreadable)
    version = load_rules().version
    if record.get("gates_version") != version:
        raise ResumeRefused(f"--resume {path}: gates.toml version {record.get('gates_version')}, now {version}")
    return record


def _gate_units(record, ops, shapes, dtypes, backends, device, seed, progress, out, heads, isolate, preload, rules,
                documents):
    finished = {(op, tuple(shape), dname) for op, shape, dname in record["units_done"]}
    gated: dict = {}   # (op, shape, dtype name) -> the backends a unit cut mid-way has rows of
    for row in record["rows"]:
        gated.setdefault((row["op"], tuple(row["shape"]), row["dtype"]), []).append(row["backend"])
    worker = _Worker(device, preload) if isolate else None
    if not isolate:
        for module in preload:
            importlib.import_module(module)
    units = list(_units(ops, shapes, dtypes, heads, rules, documents))
    bar = tqdm(units, desc="gates", disable=not progress, dynamic_ncols=True)
    try:
        for op, shape, dtype, heads_here, reason in bar:
            B, L, D = shape
            dname = str(dtype).replace("torch.", "")
            if (op, shape, dname) in finished:
                continue
            if reason is not None:
                entry = {"op": op, "backend": "*", "reason": reason}
                if entry not in record["skipped"]:
                    record["skipped"].append(entry)
                continue
            unit = {"op": op, "shape": shape, "dtype": dtype, "heads": heads_here, "backends": list(backends),
                    "seed": seed, "documents": documents, "done": tuple(gated.get((op, shape, dname), ()))}
            events = worker.gate(**unit) if isolate else gate_unit(**unit, device=device, rules=rules)
            for kind, payload in events:
                if kind in ("reference", "start"):
                    bar.set_postfix_str(f"{op} {B}x{L}x{D} {dname} {payload['backend'] if payload else 'reference'}")
                elif kind == "skip":
                    if payload not in record["skipped"]:
                        record["skipped"].append(payload)
                        where = f"{B}x{L}x{D} {dname}" if "shape" in payload else payload["backend"]
                        tqdm.write(f"skip {op} {where}: {payload['reason']}")
                elif kind == "row":
                    record["rows"].append(payload)
                    failed = ([q for q, ok in payload["passed"].items() if not ok]
                              or (["crashed"] if "exception" in payload else []))
                    packed = f" in {documents} sequences" if documents is not None else ""
                    tqdm.write(f"{'PASS' if payload['pass'] else 'FAIL'} {op} {payload['backend']} {B}x{L}x{D}{packed} "
                               f"{dname}" + (f" ({', '.join(failed)})" if failed else ""))
                elif isolate:
                    tqdm.write(f"CUDA context lost ({payload}): a fresh worker process goes on")
                else:
                    if out is not None:
                        write_record(record, out)
                    raise RuntimeError(f"the CUDA context is lost ({payload}); no later gate can run in this "
                                       "process: gate in a worker process (isolate, the default on CUDA)")
            record["units_done"].append([op, list(shape), dname])
            end_unit(record, out, device)
    finally:
        if worker is not None:
            worker.close()
    record["complete"] = True
    if out is not None:
        write_record(record, out)
    return record


def _run_gates(ops, shapes, dtypes, backends, device, seed, progress, command, out, heads, isolate, preload, rules,
               documents, resume):
    if resume is not None:
        record = resume
        ops, shapes, dtypes, backends, seed, heads, documents = _run_arguments(record)
    else:
        arguments = {"ops": list(ops), "shapes": [list(s) for s in shapes], "backends": list(backends), "seed": seed,
                     "dtypes": [str(d).replace("torch.", "") for d in dtypes], "heads": heads, "documents": documents}
        record = new_record("gate", environment(device), command, gates_version=rules.version,
                            gates_file="samu/gates/gates.toml", skipped=[], complete=False, arguments=arguments,
                            units_done=[])
    with holding_run_lock(record, resumed=resume is not None, path=out):
        return _gate_units(record, ops, shapes, dtypes, backends, device, seed, progress, out, heads, isolate,
                           preload, rules, documents)


def run_gates(ops, shapes, dtypes, backends, device, seed: int = 0, progress: bool = True,
              command: str = "samu gate", out=None, heads: "int | None" = None, isolate: "bool | None" = None,
              preload=(), documents: "int | None" = None, resume: "dict | None" = None) -> dict:
    """Run every gate asked for and return the record; with ``out``, the record is rewritten after
    every (op, shape, dtype), so a run stopped early keeps its finished rows (``complete`` false).
    ``heads``: RG-LRU's head count (default: gates.toml's, or the largest divisor of D below it).
    ``isolate`` (default: on CUDA) gates in a child process: a kernel fault fails the row of the
    backend it happened in (blocking its class) and a fresh child goes on, since a faulted CUDA
    context cannot be reused; this process only keeps the record. ``preload``: modules the gating
    process imports first (variants that register on import, such as a test's). ``documents``: gate
    packed calls of that many sequences (the module docstring). ``resume``: the record of a run cut short
    (resumable_record), which this run continues with its own ``arguments`` (those given here are not used): it
    keeps its rows, gates no unit it finished again, and of a unit it cut only the backends it lacks."""
    rules = load_rules()
    device = torch.device(device)
    isolate = device.type == "cuda" if isolate is None else isolate
    # the backends gated here must not start gates of their own (dispatch's first-use gating)
    auto_gate, os.environ["SAMU_AUTO_GATE"] = os.environ.get("SAMU_AUTO_GATE"), "0"
    try:
        return _run_gates(ops, shapes, dtypes, backends, device, seed, progress, command, out, heads, isolate,
                          preload, rules, documents, resume)
    finally:
        if auto_gate is None:
            os.environ.pop("SAMU_AUTO_GATE", None)
        else:
            os.environ["SAMU_AUTO_GATE"] = auto_gate


def _gated_since(op: str, variant: str, shape_class: str) -> str:
    """The variant's Variant.gated_since in ``shape_class``, the later packed_gated_since in a packed class (the
    suffix dispatch.shape_class gives it); "" for the torch path and for a name no longer registered."""
    registered = dispatch.variants(op).get(variant) if dispatch.triton_available() else None
    if registered is None:
        return ""
    packed = shape_class.endswith(dispatch.PACKED_CLASS)
    return max(registered.gated_since, registered.packed_gated_since if packed else "")


def record_platform(record: dict) -> str:
    """The platform a gate record speaks for (gate_status.platform): its GPU, or "cpu", and Triton's release."""
    env = record.get("env", {})
    return gate_status.platform(env.get("gpu") or "cpu", env.get("triton"))


def status_from_records(records: list, version: "int | None" = None, platform: "str | None" = None) -> dict:
    """Dispatch status from gate records: (op, variant, shape class) is blocked when the newest row
    of any shape it was tested at failed. A pass at one shape never clears a failure at another;
    only a newer run of the same shape (or moving the failing record to quarantine) does. With
    ``version``, records written under another gates.toml version are left out, and always a variant's rows
    in records older than its ``gated_since``; with ``platform``, records made on another platform."""
    latest: dict = {}
    platforms = set()
    for path, record in records:
        if record["kind"] != "gate" or (version is not None and record.get("gates_version") != version):
            continue
        if platform is not None and record_platform(record) != platform:
            continue
        platforms.add(record_platform(record))
        stamp = (record["created"], path)
        for row in record["rows"]:
            if record["created"] < _gated_since(row["op"], row["variant"], row["shape_class"]):
                continue
            unit = (row["op"], row["variant"], row["shape_class"], tuple(row.get("shape", ())))
            if unit not in latest or stamp > latest[unit][0]:
                latest[unit] = (stamp, [row])
            elif stamp == latest[unit][0]:
                latest[unit][1].append(row)
    keys = {unit[:3] for unit in latest}
    blocked_keys = sorted({unit[:3] for unit, (_, rows) in latest.items() if not all(r["pass"] for r in rows)})
    passed_keys = sorted(keys - set(blocked_keys))
    return {"blocked": [list(k) for k in blocked_keys], "passed": [list(k) for k in passed_keys],
            "platforms": sorted(platforms), "sources": sorted({stamp[1] for stamp, _ in latest.values()})}


def status_by_platform(records: list, version: "int | None" = None) -> dict:
    """status_from_records for each platform the records were made on, by platform."""
    return {platform: status_from_records(records, version, platform)
            for platform in sorted({record_platform(r) for _, r in records})}


def update_status(results, extra: "list | None" = None, path: "Path | None" = None) -> tuple[Path, dict]:
    """Rebuild the status file from every non-quarantined gate record under ``results`` (plus ``extra``), one
    section per platform the records were made on (samu.ops.gate_status): the records alone decide."""
    if not dispatch.triton_available():
        raise ValueError("a dispatch status needs the Triton variants' registry (their gated_since): install triton")
    records = load_records(results, kind="gate")
    records += [(p, r) for p, r in extra or [] if all(r != known for _, known in records)]
    by_platform = {platform: {k: section[k] for k in ("passed", "blocked", "sources")}
                   for platform, section in status_by_platform(records, load_rules().version).items()
                   if section["passed"] or section["blocked"]}
    status = {"by_platform": by_platform}
    path = Path(path) if path else status_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # written beside and renamed: a process reading the status never sees half a file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    reload()
    return path, status


def _into_user_records(records: list) -> None:
    """Copy gate records into the user's records folder (gate_status.user_records), which alone the user's status
    is rebuilt from, leaving out runs already there, quarantined ones too (a quarantined record never returns)."""
    folder = gate_status.user_records()
    kept = []
    for path in folder.rglob("*.json") if folder.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            kept.append((path, json.loads(path.read_text())))
    for _, record in records:
        there = [(path, k) for path, k in kept if same_run(k, record)]
        if not there:
            write_record(record, folder)
            kept.append((None, record))
        # a run resumed since it was copied: its copy gets the rows gated since (outside quarantine)
        for path, k in there:
            if path is not None and "quarantine" not in path.parts and len(k["rows"]) < len(record["rows"]):
                write_record(record, path)


def _legacy_blocks(path: Path) -> list:
    """The blocks of a user status written before it was rebuilt from samu's own records (merged from records
    elsewhere): a gate run must not silently drop them."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [] if "by_platform" in old else old.get("blocked", [])


def _user_lock(mine: bool):
    """One process at a time copies records into the user's folder and rebuilds its status (not dispatch's .lock,
    which the parent of a first-use gate holds)."""
    if not mine:
        return contextlib.nullcontext()
    gate_status.user_records().mkdir(parents=True, exist_ok=True)
    return FileLock(gate_status.user_records() / ".status.lock")


def _counts(status: dict) -> str:
    return "; ".join(f"{p}: {len(v['blocked'])} blocked, {len(v['passed'])} passed"
                     for p, v in status["by_platform"].items()) or "no verdicts"


def _resumed(args):
    """The record ``samu gate --resume`` continues (resumable_record), its run's arguments set on ``args``; a one-line
    exit naming --resume when it cannot be resumed."""
    try:
        record = resumable_record(args.resume, args.device, args.command_line)
    except ResumeRefused as err:
        raise SystemExit(f"samu gate: error: {err}") from None
    args.ops, args.shapes, args.dtypes, args.backends, args.seed, args.heads, args.documents = _run_arguments(record)
    return record


def gate_command(args) -> int:
    """Entry of ``samu gate`` (argparse namespace from samu.bench.cli). The user's status (the default target) is
    rebuilt from the user's records folder, into which this run's record goes too (and, with --status-only, the
    gate records of --results); a named status file from --results and this run's record."""
    resume = _resumed(args) if args.resume is not None else None
    target = Path(args.status) if args.status else status_path()
    mine = target.resolve() == gate_status.user_file().resolve()
    source = gate_status.user_records() if mine else args.results
    if args.status_only:
        with _user_lock(mine):
            if mine:
                _into_user_records(load_records(args.results, kind="gate"))
            path, status = update_status(source, path=target)
        print(f"status: {path} ({_counts(status)})")
        return 0
    blocks = _legacy_blocks(target) if mine and not args.no_status else []
    if blocks:
        raise SystemExit(f"samu gate: error: {target} blocks {len(blocks)} classes from records samu does not keep "
                         "(an older samu merged them): rebuild it from them first, `samu gate --status-only "
                         "--results <their folder>`, or remove it")
    if args.jobs > 1:
        warmed = warm(args.ops, args.shapes, args.dtypes, args.backends, args.device, args.jobs,
                      args.warm_budget, args.seed, args.heads, progress=not args.quiet)
        errors = [(item, err) for item, _, err in warmed if err]
        print(f"warm-up: {len(warmed)} units in {args.jobs} processes, {len(errors)} with errors"
              + "".join(f"\n  {item[0]} {item[1]} {item[2]} {item[3]}: {err}" for item, err in errors))
    out_path = args.resume if resume is not None else args.out or "results/gates"
    try:
        record = run_gates(args.ops, args.shapes, args.dtypes, args.backends, args.device, seed=args.seed,
                           progress=not args.quiet, command=args.command_line, out=out_path, heads=args.heads,
                           isolate=False if args.no_isolate else None, documents=args.documents, resume=resume)
    except ResumeRefused as err:
        raise SystemExit(f"samu gate: error: {err}") from None
    out = write_record(record, out_path)
    print(f"record: {out}")
    failed = [r for r in record["rows"] if not r["pass"]]
    print(f"{len(record['rows']) - len(failed)} passed, {len(failed)} failed")
    if not args.no_status and not dispatch.triton_available():
        print("status: not rebuilt (without triton no Triton variant is dispatched, and its registry is missing)")
    elif not args.no_status:
        with _user_lock(mine):
            if mine:
                _into_user_records([(out.as_posix(), record)])
            path, status = update_status(source, extra=[(out.as_posix(), record)], path=target)
        print(f"status: {path} ({_counts(status)})")
    return 1 if failed and args.strict else 0
