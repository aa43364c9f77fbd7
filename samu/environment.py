"""Where a number came from: the machine, the software stack and the commit of the code that produced it.

Every record (``samu bench``, ``samu gate``), training log and device script stamps itself with
``environment(device)``.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

import torch


def _run(args, cwd=None) -> "str | None":
    try:
        out = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def git_state() -> tuple:
    """(commit, dirty) of the checkout holding this package; ``SAMU_GIT_COMMIT`` (a commit's hex digits,
    for a copy of the tree without .git) overrides both."""
    given = os.environ.get("SAMU_GIT_COMMIT")
    if given:
        if not re.fullmatch(r"[0-9a-f]{7,40}", given):
            raise ValueError(f"SAMU_GIT_COMMIT must be a commit's hex digits (7 to 40), got {given!r}")
        return given, None
    root = Path(__file__).resolve().parents[1]
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return "unknown", None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return commit, None if status is None else bool(status)


def _driver() -> "str | None":
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out:
        return out.splitlines()[0].strip()
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001  (any NVML failure just means "driver unknown")
        return None


def triton_version() -> "str | None":
    """The installed Triton's version, read without importing it: the "triton" package or PyTorch's own build
    of it ("pytorch-triton")."""
    for name in ("triton", "pytorch-triton"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


def environment(device) -> dict:
    """What a reader needs to place a number: machine, software versions and the code's commit."""
    device = torch.device(device)
    commit, dirty = git_state()
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "triton": triton_version(),
        "python": platform.python_version(),
        "device": device.type,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "gpu_memory": torch.cuda.get_device_properties(device).total_memory if cuda else None,
        "driver": _driver() if cuda else None,
        "cpu": platform.processor() or platform.machine(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "git_commit": commit,
        "git_dirty": dirty,
    }
