"""Correctness gates (spec §7): thresholds in gates.toml, results in JSON records.

``gates.toml`` declares the rules (``rules.py`` applies them), ``inputs.py`` draws the random
inputs and ``runner.py`` is ``samu gate``: it writes each run's record and rebuilds a status file
of the (op, variant, shape class) triples whose gates passed or failed. Dispatch reads that status
through ``samu.ops.gate_status`` (its own layer; re-exported here): it picks a Triton variant for
a shape class only where the variant passed there.
"""

from __future__ import annotations

from samu.ops.gate_status import reload, status_path

__all__ = ["reload", "status_path"]
