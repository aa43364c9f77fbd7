"""Which Triton variants have passed their correctness gates, as dispatch reads it.

A status file lists (op, variant, shape class) triples under "passed" and "blocked" (the class's
newest gate row at some shape failed), and under "platforms" the one GPU and Triton release its
records were made on (samu.gates.runner.update_status). A status speaks only for its platform: on
another GPU or Triton release its verdicts do not apply, and dispatch gates what it meets on first
use. The packaged ``samu/gates/status.json`` is built from the project's committed H200 gate records.
The user's own status (``samu gate`` on your GPU, or that first-use gating) lives in
``gate_status.json`` in the samu cache folder and replaces the packaged verdict of every triple it
names on its platform (a gate on another platform rebuilds it from that platform's records).
``SAMU_GATE_STATUS`` names one file that replaces both on every platform (the measurement suite uses it).

Both files are read once, at import and on ``reload()``, never inside a call: a lookup is a
dict access, which torch.compile traces without a graph break.
"""

from __future__ import annotations

import json
import os
import warnings
from importlib import metadata
from pathlib import Path

import torch

from samu.paths import cache_dir

PACKAGED = Path(__file__).resolve().parents[1] / "gates" / "status.json"


def user_file() -> Path:
    return cache_dir() / "gate_status.json"


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


def _triples(status: dict, kind: str) -> frozenset:
    return frozenset(tuple(k) for k in status.get(kind, []))


_STATUS: dict = {}


def reload() -> None:
    """Read the status files again (after ``samu gate`` rewrote one, or SAMU_GATE_STATUS changed)."""
    one = override()
    mine = _read(one) if one is not None else _read(user_file())
    packaged = {} if one is not None else _read(PACKAGED)
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    _STATUS.clear()
    _STATUS.update(mine={k: _triples(mine, k) for k in ("passed", "blocked")},
                   packaged={k: _triples(packaged, k) for k in ("passed", "blocked")},
                   # the named file speaks for every platform (None), the user's for its own
                   mine_platforms=None if one is not None else frozenset(mine.get("platforms", [])),
                   platforms=frozenset(packaged.get("platforms", [])), triton=triton,
                   source=str(one) if one is not None else f"{PACKAGED} + {user_file()}")


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


def speaks_for(platforms: frozenset, device) -> bool:
    """Whether a status made on ``platforms`` speaks for ``device``. Where a CUDA device's GPU cannot be
    named, a GPU platform with the installed Triton release does."""
    here = device_platform(device)
    if here is None:
        release = platform(None, _STATUS["triton"]).split("|")[1]
        return any(p.split("|")[1] == release and not p.startswith("cpu|") for p in platforms)
    return here in platforms


def _mine_applies(device) -> bool:
    """The user's verdicts speak for their own platform, a named file's (SAMU_GATE_STATUS) for every device."""
    platforms = _STATUS["mine_platforms"]
    return platforms is None or speaks_for(platforms, device)


def verdict(op: str, variant: str, shape_class: str, device="cuda") -> "str | None":
    """"passed", "blocked" or None (never gated here) for one triple on ``device``."""
    key = (op, variant, shape_class)
    for status in (_STATUS["mine"] if _mine_applies(device) else None,
                   _STATUS["packaged"] if speaks_for(_STATUS["platforms"], device) else None):
        if status is not None:
            if key in status["blocked"]:
                return "blocked"
            if key in status["passed"]:
                return "passed"
    return None


reload()
