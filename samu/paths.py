"""Where samu keeps what it builds once per machine (the corpus cache, the user's gate status)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SAMU_CACHE, else $XDG_CACHE_HOME/samu, else ~/.cache/samu."""
    if os.environ.get("SAMU_CACHE"):
        return Path(os.environ["SAMU_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "samu"
