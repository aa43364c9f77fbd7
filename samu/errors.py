"""Exceptions a training run ends with, in a module of their own so the command line can catch them
without importing the training loop."""

from __future__ import annotations

import signal
from pathlib import Path


class TrainingDiverged(RuntimeError):
    """The loss or the parameters became non-finite; nothing after the last good checkpoint was saved."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM: the run saved a checkpoint after ``step`` and stopped."""

    def __init__(self, signum: int, step: int, steps: int, out: Path):
        super().__init__(f"{signal.Signals(signum).name} after step {step} of {steps}")
        self.signum, self.step, self.steps, self.out = signum, step, steps, out


class RunFolderBusy(OSError):
    """Another process holds the run folder."""
