"""Correctness gates (SPEC §7): thresholds in gates.toml, results in JSON records.

``gates.toml`` declares the rules (``rules.py`` applies them), ``inputs.py`` draws the random
inputs and ``runner.py`` is ``samu gate``. ``passed()`` and ``blocked()`` list the (op, variant,
shape class) triples whose latest gate record passed or failed: dispatch picks a Triton variant
for a shape class only when it passed there.

The status comes from ``status.json`` beside this file (built from the project's committed gate
records) overlaid by the user's own (``samu gate`` on your GPU writes ``gate_status.json`` in the
samu cache folder when the package folder is not writable); ``SAMU_GATE_STATUS`` names one file
that replaces both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

STATUS_FILE = Path(__file__).with_name("status.json")


def _user_file() -> Path:
    cache = os.environ.get("SAMU_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "samu"
    return Path(cache) / "gate_status.json"


def status_path() -> Path:
    """Where ``samu gate`` writes the status."""
    if "SAMU_GATE_STATUS" in os.environ:
        return Path(os.environ["SAMU_GATE_STATUS"])
    return STATUS_FILE if os.access(STATUS_FILE.parent, os.W_OK) else _user_file()


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


_cache: dict = {}


def _status() -> dict:
    """{"passed": frozenset, "blocked": frozenset} of (op, variant, shape class), read once until
    ``reload()`` (a plain dict, not functools.lru_cache, so torch.compile traces it quietly)."""
    if not _cache:
        if "SAMU_GATE_STATUS" in os.environ:
            merged = _read(Path(os.environ["SAMU_GATE_STATUS"]))
        else:
            status = _read(STATUS_FILE)
            user = _read(_user_file())
            # the user's verdict on a (op, variant, shape class) replaces the packaged one
            mine = {tuple(k) for k in user.get("passed", []) + user.get("blocked", [])}
            merged = {kind: [k for k in status.get(kind, []) if tuple(k) not in mine] + user.get(kind, [])
                      for kind in ("passed", "blocked")}
        _cache.update({kind: frozenset(tuple(k) for k in merged.get(kind, [])) for kind in ("passed", "blocked")})
    return _cache


def blocked() -> frozenset:
    return _status()["blocked"]


def passed() -> frozenset:
    return _status()["passed"]


def reload() -> None:
    """Forget the cached status (after ``samu gate`` rewrote it, or SAMU_GATE_STATUS changed)."""
    _cache.clear()
