"""Checkpoints: one file holding the model state dict, its config as JSON and, for resuming
training, the optimizer, scheduler and step. Written atomically; loaded with ``weights_only``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn as nn

from samu.models.build import build_model
from samu.models.config import model_config_from_dict
from samu.models.model import CausalLM

FORMAT = "samu-lm"
# 2: embeddings without the sqrt(width) input scale (version-1 weights mean something else)
VERSION = 2


class CheckpointError(ValueError):
    """A file that is not a readable samu checkpoint, or one that does not match what it claims."""


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel or torch.compile wrapper."""
    while True:
        inner = getattr(model, "module", getattr(model, "_orig_mod", None))
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _umask() -> int:
    """The process umask, read without setting it where Linux allows (setting it is process-wide)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


class WriteError(OSError):
    """A file samu could not write (disk full, permissions, a vanished folder), in one line."""


def _write_failure(path: Path, err: BaseException) -> WriteError:
    if isinstance(err, OSError) and err.errno is not None:
        cause = os.strerror(err.errno)
    else:
        # torch.save reports a full disk as a RuntimeError ("unexpected pos ...")
        cause = f"the write failed ({' '.join(str(err).split())[:120]})"
    try:
        cause += f"; {shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free there"
    except OSError:
        pass
    return WriteError(f"cannot write {path}: {cause}")


def temporaries(folder: Path, name: str) -> list[Path]:
    """What atomic_write leaves in ``folder`` when killed while writing files matching ``name`` (a
    glob): ``.<name>.<random>.tmp`` and ``.<name>.copy.tmp``."""
    return list(Path(folder).glob(f".{name}.*.tmp"))


def atomic_write(path, write, keep_as=None) -> None:
    """Call ``write(tmp_path)``, then move the result onto ``path``: readers never see half a file.
    ``keep_as``: the file ``path`` held before stays there under this name. A failure removes the
    temporary file and is a WriteError naming ``path`` and the cause."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        write(tmp)
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(tmp, 0o666 & ~_umask())
        _fsync(tmp)
        if keep_as is not None and path.exists():
            _link_or_copy(path, Path(keep_as))
        os.replace(tmp, path)
        _fsync(path.parent)
    except (OSError, RuntimeError) as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise _write_failure(path, err) from None
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def _fsync(path) -> None:
    """Flush a file's (or a folder's entries') data to the disk: a power cut leaves no empty file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder
        pass
    finally:
        os.close(fd)


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` becomes another name of ``src``; where hard links are not supported, a copy that
    appears under ``dst`` only once complete."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        part = dst.with_name(f".{dst.name}.copy.tmp")
        shutil.copy2(src, part)
        os.replace(part, dst)


def save_checkpoint(path, model: nn.Module, train_state: dict | None = None, keep_as=None) -> None:
    """Write ``model`` (a LanguageModel or TransformerLM, possibly wrapped) and optional training state to
    ``path`` (``keep_as``: the checkpoint it replaces stays under that name)."""
    model = unwrap(model)
    if not isinstance(model, CausalLM):
        raise TypeError(f"model must be a LanguageModel or a TransformerLM, got {type(model).__name__}")
    payload = {"format": FORMAT, "version": VERSION, "config": json.dumps(model.config.to_dict()),
               "model": model.state_dict()}
    if train_state is not None:
        payload["train"] = train_state
    atomic_write(path, lambda tmp: torch.save(payload, tmp), keep_as)


def load_checkpoint(path, map_location="cpu") -> dict:
    """The validated contents of a checkpoint: keys format, version, config (LMConfig or TransformerConfig),
    model, train?"""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt, truncated or not written "
                              f"by samu; {type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a samu language-model checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')!r}; "
                              f"this samu reads version {VERSION}")
    try:
        payload["config"] = model_config_from_dict(json.loads(payload["config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} has an invalid model config: {e}") from None
    if not isinstance(payload.get("model"), dict):
        raise CheckpointError(f"{path} has no model state dict")
    return payload


def load_model(path, *, device=None, backend: str = "auto", payload: dict | None = None) -> CausalLM:
    """The model of a checkpoint's config (a LanguageModel or a TransformerLM), with its weights."""
    payload = load_checkpoint(path) if payload is None else payload
    model = build_model(payload["config"], backend=backend, device=device)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{path}: weights do not match the checkpoint's config ({first})") from None
    return model
