"""Which Triton variants have passed their correctness gates, as dispatch reads it.

A status file lists (op, variant, shape class) triples under "passed" and "blocked" (the class's
newest gate row at some shape failed). The packaged ``samu/gates/status.json`` is built from the
project's committed H200 gate records; the user's own status (``samu gate`` on your GPU, or
dispatch gating a class on first use) lives in ``gate_status.json`` in the samu cache folder and
replaces the packaged verdict of every triple it names. ``SAMU_GATE_STATUS`` names one file that
replaces both (the measurement suite uses it).

Both files are read once, at import and on ``reload()``, never inside a call: a lookup is a
dict access, which torch.compile traces without a graph break.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PACKAGED = Path(__file__).resolve().parents[1] / "gates" / "status.json"


def cache_dir() -> Path:
    """$SAMU_CACHE, else $XDG_CACHE_HOME/samu, else ~/.cache/samu."""
    if os.environ.get("SAMU_CACHE"):
        return Path(os.environ["SAMU_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "samu"


def user_file() -> Path:
    return cache_dir() / "gate_status.json"


def override() -> "Path | None":
    """The one status file named by SAMU_GATE_STATUS, if any."""
    return Path(os.environ["SAMU_GATE_STATUS"]) if os.environ.get("SAMU_GATE_STATUS") else None


def status_path() -> Path:
    """Where ``samu gate`` writes the status by default: SAMU_GATE_STATUS, else the packaged file
    when its folder is writable (a source checkout), else the user's file."""
    if override() is not None:
        return override()
    return PACKAGED if os.access(PACKAGED.parent, os.W_OK) else user_file()


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise ValueError(f"gate status file {path} cannot be read ({err}); remove it or run `samu gate`") from None


_STATUS: dict = {}


def reload() -> None:
    """Read the status files again (after ``samu gate`` rewrote one, or SAMU_GATE_STATUS changed)."""
    one = override()
    if one is not None:
        merged = _read(one)
    else:
        packaged, user = _read(PACKAGED), _read(user_file())
        mine = {tuple(k) for k in user.get("passed", []) + user.get("blocked", [])}
        merged = {kind: [k for k in packaged.get(kind, []) if tuple(k) not in mine] + user.get(kind, [])
                  for kind in ("passed", "blocked")}
    _STATUS.clear()
    _STATUS.update({kind: frozenset(tuple(k) for k in merged.get(kind, [])) for kind in ("passed", "blocked")})
    _STATUS["source"] = str(one) if one is not None else f"{PACKAGED} + {user_file()}"


def passed() -> frozenset:
    return _STATUS["passed"]


def blocked() -> frozenset:
    return _STATUS["blocked"]


def verdict(op: str, variant: str, shape_class: str) -> "str | None":
    """"passed", "blocked" or None (never gated) for one triple."""
    key = (op, variant, shape_class)
    if key in _STATUS["blocked"]:
        return "blocked"
    return "passed" if key in _STATUS["passed"] else None


reload()
