"""Which Triton variants have passed their correctness gates, as dispatch reads it.

A status file lists (op, variant, shape class) triples under "passed" and "blocked" (the class's
newest gate row at some shape failed), and under "platforms" the GPUs and Triton versions its
records were made on. The packaged ``samu/gates/status.json`` is built from the project's
committed H200 gate records and speaks only for those platforms: on another GPU or Triton release
its verdicts do not apply, and dispatch gates what it meets on first use. The user's own status
(``samu gate`` on your GPU, or that first-use gating) lives in ``gate_status.json`` in the samu
cache folder and replaces the packaged verdict of every triple it names. ``SAMU_GATE_STATUS``
names one file that replaces both (the measurement suite uses it).

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


def packaged_applies(device) -> bool:
    """Whether the packaged verdicts speak for ``device``: a CUDA device whose GPU and installed
    Triton release are among the packaged platforms. Where the GPU cannot be named (inside a
    torch.compile trace before any eager call, or without CUDA) only the Triton release is checked."""
    if torch.device(device).type != "cuda":
        return False
    gpu = _gpu(device)
    mine = platform(gpu, _STATUS["triton"])
    if gpu is None:
        # the GPU cannot be named here: the Triton release must still match
        return any(p.split("|")[1] == mine.split("|")[1] for p in _STATUS["platforms"])
    return mine in _STATUS["platforms"]


def verdict(op: str, variant: str, shape_class: str, device="cuda") -> "str | None":
    """"passed", "blocked" or None (never gated here) for one triple on ``device``."""
    key = (op, variant, shape_class)
    for status in (_STATUS["mine"], _STATUS["packaged"] if packaged_applies(device) else None):
        if status is not None:
            if key in status["blocked"]:
                return "blocked"
            if key in status["passed"]:
                return "passed"
    return None


reload()
