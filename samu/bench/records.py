"""JSON records of bench and gate runs: writing, loading, schema, quarantine (their environment stamp is
samu.environment's).

A record is one JSON file per command run: ``{"schema", "kind", "created", "command", "env",
"rows", ...}``. Only its own run writes a record (after every unit, and again when ``--resume`` goes on with it);
nothing edits it after that. A record found to be wrong is moved whole into ``results/quarantine/`` (see the README
there) and is never read again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import uuid
from pathlib import Path

import torch

from samu.paths import FileLock, cache_dir

SCHEMAS = {"bench": "samu.bench/1", "gate": "samu.gate/1"}
QUARANTINE = "quarantine"
# development measurements (results/dev): cited by the performance log and issue notes, never read here, so
# a side-by-side study of a few candidates never displaces a full run's unit in the report or the status
DEV = "dev"
RESULTS = Path("results")

_TOP = ("schema", "kind", "created", "command", "env", "rows")
# what a resumed run must share with the run it continues (resumable)
_SAME_RUN_ENV = ("gpu", "device", "triton", "triton_interpret", "torch", "git_commit", "git_dirty")
_ENV = ("torch", "triton", "python", "device", "gpu", "driver", "git_commit", "git_dirty")
_ROW = {
    "bench": ("scope", "op", "impl", "candidate", "peer", "shape", "dtype", "median_ms", "round_medians_ms",
              "samples_ms", "peak_alloc", "peak_reserved", "launches", "params", "choice", "choice_reason",
              "scratch_formula", "scratch_bytes", "floor_formula", "floor_bytes", "floor_ms", "floor_ratio"),
    "gate": ("op", "backend", "variant", "shape", "shape_class", "dtype", "seed", "errors", "baselines",
             "thresholds", "passed", "pass"),
}


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_record(kind: str, env: dict, command: str, **fields) -> dict:
    if kind not in SCHEMAS:
        raise ValueError(f"kind must be one of {sorted(SCHEMAS)}, got {kind!r}")
    return {"schema": SCHEMAS[kind], "kind": kind, "created": now(), "run_id": uuid.uuid4().hex, "command": command,
            "env": env, "rows": [], **fields}


def dumps(record: dict) -> str:
    return json.dumps(record, indent=1, sort_keys=True, allow_nan=False) + "\n"


def end_unit(record: dict, out, device) -> None:
    """After each (shape, dtype) unit: free cached device memory and, with ``out``, rewrite the
    partial record, so a run stopped early keeps what it finished."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    if out is not None:
        write_record(record, out)


def write_record(record: dict, out) -> Path:
    """Write ``record`` to the file ``out`` (``*.json``) or into the folder ``out`` under a dated name."""
    problems = validate(record)
    if problems:
        raise ValueError("record does not match its schema: " + "; ".join(problems))
    out = Path(out)
    if out.suffix != ".json":
        if out.is_file():
            raise FileExistsError(f"--out {out} is a file, not a folder or a .json record path")
        stamp = record["created"].replace("-", "").replace(":", "")
        base, n = out / f"{record['kind']}-{stamp}", 1
        out = base.with_suffix(".json")
        while out.exists() and not _same_run(out, record):   # another run's of the same second
            n += 1
            out = base.with_name(f"{base.name}-{n}.json")
    if out.exists() and not _same_run(out, record):
        raise FileExistsError(f"--out {out} exists and is not this run's record; samu never overwrites another "
                              f"run's record or a file it did not write: choose another path")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(dumps(record))
    tmp.replace(out)
    return out


def _same_run(path: Path, record: dict) -> bool:
    """Whether ``path`` holds an earlier write of ``record`` (a run rewrites its record as it goes)."""
    try:
        there = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return same_run(there, record)


def same_run(there, record: dict) -> bool:
    """Whether ``there`` is a write of the run ``record`` is from."""
    # records from before run ids (on both sides): the same kind, time, command and machine
    keys = ("kind", "created", "run_id") if record.get("run_id") else ("kind", "created", "command", "env", "run_id")
    return isinstance(there, dict) and all(there.get(k) == record.get(k) for k in keys)


def validate(record) -> list[str]:
    """Schema problems of one record (empty when it is well formed)."""
    if not isinstance(record, dict):
        return ["a record is a JSON object"]
    problems = [f"missing {k!r}" for k in _TOP if k not in record]
    kind = record.get("kind")
    if kind not in SCHEMAS:
        return problems + [f"unknown kind {kind!r}"]
    if record.get("schema") != SCHEMAS[kind]:
        problems.append(f"schema {record.get('schema')!r} is not {SCHEMAS[kind]!r}")
    env = record.get("env")
    if isinstance(env, dict):
        problems += [f"env misses {k!r}" for k in _ENV if k not in env]
    else:
        problems.append("env is not an object")
    rows = record.get("rows")
    if not isinstance(rows, list):
        return problems + ["rows is not a list"]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(f"row {i} is not an object")
            continue
        problems += [f"row {i} misses {k!r}" for k in _ROW[kind] if k not in row]
        shape = row.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(s, int) for s in shape)):
            problems.append(f"row {i} shape must be [B, L, D], got {shape!r}")
    return problems


def is_int(value, minimum: int = 0) -> bool:
    """Whether ``value`` is an int (not a bool) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def is_shape(value) -> bool:
    """Whether ``value`` is a [B, L, D] of positive ints (a shape as a record keeps it)."""
    return isinstance(value, (list, tuple)) and len(value) == 3 and all(is_int(v, 1) for v in value)


def is_shapes(value) -> bool:
    """Whether ``value`` is a list of shapes (is_shape)."""
    return isinstance(value, list) and all(is_shape(v) for v in value)


def is_names(value, allowed=None) -> bool:
    """Whether ``value`` is a list of strings (all in ``allowed``, when given)."""
    return isinstance(value, list) and all(isinstance(v, str) and (allowed is None or v in allowed) for v in value)


class ResumeRefused(ValueError):
    """Why a record cannot be resumed, in one line naming --resume (the commands print it and exit)."""


def run_lock(record: dict) -> Path:
    """The lock a bench or gate run holds while it writes its record (a resumption asks it first: not while the run
    goes), in samu's cache folder. Lock files stay (a run id is never reused): removing one while another process
    waits on it would let two processes hold the lock."""
    folder = cache_dir() / f"{record['kind']}-runs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{record['run_id']}.lock"


def _read_record(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ResumeRefused(f"--resume {path}: cannot be read ({err})") from None


@contextlib.contextmanager
def holding_run_lock(record: dict, resumed: bool = False, path=None):
    """Hold ``record``'s run lock (run_lock) for a ``with`` block. A ``resumed`` record is refused (ResumeRefused) when
    another run holds its lock, or when its file at ``path`` has gone on since it was read (two resumptions of one
    record: the later one would time again what the first added, and drop its note)."""
    where = path if path is not None else f"(run {record['run_id']})"
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(FileLock(run_lock(record), wait=not resumed))
        except BlockingIOError:
            raise ResumeRefused(f"--resume {where}: its run is still going") from None
        if resumed and path is not None:
            there = _read_record(path)
            if (there.get("units_done"), len(there.get("rows") or ()), there.get("resumed", [])) != (
                    record["units_done"], len(record["rows"]), record.get("resumed", [])[:-1]):
                raise ResumeRefused(f"--resume {where}: another run went on with the record since it was read")
        yield


def resumable(path, kind: str, here: dict, command: str, problems=None) -> dict:
    """The ``kind`` record at ``path``, to be continued by ``command`` in the environment ``here``
    (samu.environment's stamp) with the record's own ``arguments`` and ``units_done``; ResumeRefused unless it is the
    well-formed record of an unfinished run that is not still going, made in this environment at this (clean, known)
    commit. ``problems(record)``: the kind's own reasons why the record cannot be read back (a string each). Notes the
    resumption in the record."""
    record = _read_record(path)
    if not isinstance(record, dict) or record.get("kind") != kind:
        raise ResumeRefused(f"--resume {path}: not a {kind} record")
    wrong = validate(record)
    if wrong:
        raise ResumeRefused(f"--resume {path}: not a well-formed {kind} record ({'; '.join(wrong)})")
    if record.get("complete"):
        raise ResumeRefused(f"--resume {path}: that run finished; there is nothing to resume")
    if not isinstance(record.get("arguments"), dict) or not isinstance(record.get("units_done"), list):
        raise ResumeRefused(f"--resume {path}: the record does not keep its run's arguments (made before --resume)")
    wrong = list(problems(record) if problems else ()) + (
        [] if isinstance(record.get("resumed", []), list) else ["resumed is not a list"])
    if wrong:
        raise ResumeRefused(f"--resume {path}: not a well-formed {kind} record ({'; '.join(wrong)})")
    if record["env"].get("git_dirty"):
        raise ResumeRefused(f"--resume {path}: its run was made from uncommitted code, which cannot be told apart")
    if record["env"].get("git_commit") == "unknown":
        raise ResumeRefused(f"--resume {path}: its run's commit is unknown (no .git; SAMU_GIT_COMMIT names it), so "
                            "other code could not be told apart")
    for key in _SAME_RUN_ENV:
        if record["env"].get(key) != here.get(key):
            raise ResumeRefused(f"--resume {path}: its run had {key} {record['env'].get(key)!r}, this one has "
                                f"{here.get(key)!r}; a run of other code or on another machine is a run of its own")
    try:
        with FileLock(run_lock(record), wait=False):
            pass
    except BlockingIOError:
        raise ResumeRefused(f"--resume {path}: its run is still going") from None
    record.setdefault("resumed", []).append({"at": now(), "command": command})
    return record


def is_unread(path: Path, root: Path) -> bool:
    """Whether ``path`` under ``root`` is quarantined (anywhere) or a development measurement (root/dev)."""
    parts = Path(path).relative_to(root).parts
    return QUARANTINE in parts or parts[0] == DEV


def load_records(root=RESULTS, kind: "str | None" = None) -> list[tuple[str, dict]]:
    """Every record under ``root`` except quarantined ones and those under dev/: [(path relative to root,
    record)], sorted.

    Files that are not samu records (no known ``schema``) are ignored; a malformed samu record
    raises ValueError naming the file, so a broken record never silently drops out of a report.
    """
    root = Path(root)
    found = []
    for path in sorted(root.rglob("*.json"), key=lambda p: p.relative_to(root).as_posix()):
        if is_unread(path, root):
            continue
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(record, dict) or record.get("schema") not in SCHEMAS.values():
            continue
        problems = validate(record)
        if problems:
            raise ValueError(f"{path}: " + "; ".join(problems))
        if kind is None or record["kind"] == kind:
            found.append((path.relative_to(root).as_posix(), record))
    return found


def flagged(row) -> bool:
    """True for a bench row whose y disagrees with samu's dispatched op's (samu.bench.runner._agreement):
    it is shown, never ranked by speed."""
    return bool(((row or {}).get("agreement") or {}).get("flagged"))
