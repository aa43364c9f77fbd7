"""Which Triton variants have passed their correctness gates, as dispatch reads it.

A status file holds, per platform (a GPU's name, or "cpu" for Triton's interpreter, and a Triton
release), (op, variant, shape class) triples under "passed" and "blocked" (the class's newest gate
row at some shape failed): {"by_platform": {platform: {"passed": [...], "blocked": [...], "sources":
[...]}}} (samu.gates.runner.update_status). Verdicts speak only for their platform: on another GPU or
Triton release they do not apply, and dispatch gates what it meets on first use. The packaged
``samu/gates/status.json`` is built from the project's committed H200 gate records. The user's own
status lives in ``gate_status.json`` in the samu cache folder, built from the gate records kept in
``gates/`` there (``samu gate`` on your GPU, or that first-use gating), and replaces the packaged
verdict of every triple it names on the same platform. ``SAMU_GATE_STATUS`` names one file that
replaces both (the measurement suite uses it): each device takes its own section, a device without
one all of them together.

Both files are read once, at import and on ``reload()``, never inside a call: a lookup is a
dict access, which torch.compile traces without a graph break.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from samu.environment import triton_version
from samu.paths import cache_dir

PACKAGED = Path(__file__).resolve().parents[1] / "gates" / "status.json"


def user_file() -> Path:
    return cache_dir() / "gate_status.json"


def user_records() -> Path:
    """The gate records the user's status is built from (first-use gating and ``samu gate`` write there)."""
    return cache_dir() / "gates"


def override() -> "Path | None":
    """The one status file named by SAMU_GATE_STATUS, if any."""
    return Path(os.environ["SAMU_GATE_STATUS"]) if os.environ.get("SAMU_GATE_STATUS") else None


def status_path() -> Path:
    """Where ``samu gate`` writes the status unless told (``--status``): SAMU_GATE_STATUS, else the
    user's file. The packaged file is rewritten only when named."""
    return override() or user_file()


def platform(gpu: "str | None", triton: "str | None") -> str:
    """A platform a verdict speaks for: the GPU's name and Triton's major.minor release."""
    return f"{gpu}|triton {'.'.join(str(triton).split('.')[:2])}"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        warnings.warn(f"samu: gate status file {path} cannot be read ({err}); its verdicts are ignored "
                      f"(remove it, or rebuild it with `samu gate --status-only`)", stacklevel=2)
        return {}


def sections(status: dict) -> dict:
    """A status file's verdicts by platform. A file written before statuses were split by platform lists its
    platforms beside one set of verdicts, which each of them gets."""
    if "by_platform" in status:
        return status["by_platform"]
    return {p: status for p in status.get("platforms", [])}


def _verdicts(section: dict) -> dict:
    return {k: frozenset(tuple(t) for t in section.get(k, [])) for k in ("passed", "blocked")}


def _by_platform(status: dict, path) -> dict:
    if "by_platform" not in status and (status.get("passed") or status.get("blocked")) and not sections(status):
        warnings.warn(f"samu: gate status file {path} names no platform; its verdicts are ignored (rebuild it with "
                      f"`samu gate --status-only`)", stacklevel=3)
    return {p: _verdicts(section) for p, section in sections(status).items()}


_STATUS: dict = {}
_generation = [0]   # one more at every reload: what dispatch's remembered choices were made under


def generation() -> int:
    """How many times the status was read: a choice made from an older reading is stale."""
    return _generation[0]


def reload() -> None:
    """Read the status files again (after ``samu gate`` rewrote one, or SAMU_GATE_STATUS changed)."""
    one = override()
    _STATUS.clear()
    _generation[0] += 1
    _STATUS["triton"] = triton_version()
    _STATUS["release"] = platform(None, _STATUS["triton"]).split("|")[1]
    if one is not None:
        # the named file speaks for every platform: a device with no section of its own takes all of them (or a
        # file of no platform) as one
        named = _read(one)
        parts = [_verdicts(section) for section in sections(named).values()] or [_verdicts(named)]
        anywhere = {k: frozenset().union(*(v[k] for v in parts)) for k in ("passed", "blocked")}
        _STATUS.update(mine={p: _verdicts(v) for p, v in sections(named).items()}, anywhere=anywhere, packaged={},
                       source=str(one))
    else:
        _STATUS.update(mine=_by_platform(_read(user_file()), user_file()), anywhere=None,
                       packaged=_by_platform(_read(PACKAGED), PACKAGED), source=f"{PACKAGED} + {user_file()}")


_gpus: dict = {}  # device index -> name (read outside a trace; plain dict for torch.compile)


def _gpu(device) -> "str | None":
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _gpus and not torch.compiler.is_compiling():
        _gpus[index] = torch.cuda.get_device_name(index)
    return _gpus.get(index)


def device_platform(device) -> "str | None":
    """The platform of ``device``: its GPU's name (None where it cannot be named: inside a torch.compile trace
    before any eager call, or without CUDA) or its device type ("cpu": Triton's interpreter), and Triton's
    release."""
    device = torch.device(device)
    name = _gpu(device) if device.type == "cuda" else device.type
    return platform(name, _STATUS["triton"]) if name is not None else None


def _speaks(made_on: str, here: "str | None") -> bool:
    """Whether a section made on the platform ``made_on`` speaks for a device of platform ``here`` (device_platform).
    Where a CUDA device's GPU cannot be named (None), a GPU platform with the installed Triton release does."""
    if here is None:
        return made_on.split("|")[1] == _STATUS["release"] and not made_on.startswith("cpu|")
    return made_on == here


def verdict(op: str, variant: str, shape_class: str, device="cuda") -> "str | None":
    """"passed", "blocked" or None (never gated here) for one triple on ``device``: the user's verdicts first."""
    key = (op, variant, shape_class)
    here = device_platform(device)
    for layer, anywhere in ((_STATUS["mine"], _STATUS["anywhere"]), (_STATUS["packaged"], None)):
        # the sections that speak for this device, else (a named file) all of them together
        found = [v for p, v in layer.items() if _speaks(p, here)] or ([anywhere] if anywhere is not None else [])
        if any(key in v["blocked"] for v in found):
            return "blocked"
        if any(key in v["passed"] for v in found):
            return "passed"
    return None


reload()
