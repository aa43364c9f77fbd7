"""Correctness gates (SPEC §7): thresholds in gates.toml, results in JSON records.

``gates.toml`` declares the rules (``rules.py`` applies them), ``inputs.py`` draws the random
inputs and ``runner.py`` is ``samu gate``. ``blocked()`` lists the (op, variant, shape class)
triples whose latest gate record failed; dispatch never picks those. It reads ``status.json``
beside this file (written by ``samu gate``), or the file named by ``SAMU_GATE_STATUS``.
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
def blocked() -> frozenset:
    path = status_path()
    if not path.exists():
        return frozenset()
    status = json.loads(path.read_text())
    return frozenset(tuple(entry) for entry in status.get("blocked", []))
