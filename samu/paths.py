"""Where samu keeps what it builds once per machine (the corpus cache, the user's gate status)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SAMU_CACHE, else $XDG_CACHE_HOME/samu, else ~/.cache/samu."""
    if os.environ.get("SAMU_CACHE"):
        return Path(os.environ["SAMU_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "samu"


# A folder holding this file is a samu training run (checkpoint.pt, log.json, ...): text corpora never
# read such a folder, and the run holds the file locked for its lifetime.
RUN_MARKER = ".samu-run"


class FileLock:
    """An exclusive advisory lock on ``path`` (created if missing) for a ``with`` block; none where
    fcntl is missing. ``wait=False`` raises BlockingIOError at once when another process holds it.
    The system drops the lock when its holder dies, so a killed process never leaves it held."""

    def __init__(self, path, wait: bool = True):
        self.path, self.wait = Path(path), wait

    def __enter__(self):
        self.file = open(self.path, "a+")
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BaseException:
            self.file.close()
            raise
        return self

    def __exit__(self, *exc):
        self.file.close()
