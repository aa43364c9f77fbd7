"""Correctness gates (SPEC §7): thresholds in gates.toml, results in JSON records.

``gates.toml`` declares the rules (``rules.py`` applies them), ``inputs.py`` draws the random
inputs and ``runner.py`` is ``samu gate``. ``passed()`` and ``blocked()`` list the (op, variant,
shape class) triples whose latest gate record passed or failed: dispatch picks a Triton variant
for a shape class only when it passed there. Both read ``status.json`` beside this file (written
by ``samu gate``), or the file named by ``SAMU_GATE_STATUS``.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

STATUS_FILE = Path(__file__).with_name("status.json")


def status_path() -> Path:
    return Path(os.environ.get("SAMU_GATE_STATUS", STATUS_FILE))


@functools.lru_cache(maxsize=None)
def _status() -> dict:
    path = status_path()
    return json.loads(path.read_text()) if path.exists() else {}


def blocked() -> frozenset:
    return frozenset(tuple(entry) for entry in _status().get("blocked", []))


def passed() -> frozenset:
    return frozenset(tuple(entry) for entry in _status().get("passed", []))


def reload() -> None:
    """Forget the cached status (after ``samu gate`` rewrote it, or SAMU_GATE_STATUS changed)."""
    _status.cache_clear()
