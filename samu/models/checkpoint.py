"""Checkpoints: one file holding the model state dict, its config as JSON and, for resuming
training, the optimizer, scheduler and step. Written atomically; loaded with ``weights_only``.

A run of several processes writes a sharded checkpoint instead: a folder that
torch.distributed.checkpoint (DCP) fills with the model's and the optimizer's state, each process its
own shards, and ``samu.pt`` (the same file without those two states). Any number of processes reads it
back (DCP reshards), one process too; ``load_checkpoint`` and ``load_model`` take either kind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from samu.models.build import build_model
from samu.models.config import model_config_from_dict
from samu.models.model import CausalLM

FORMAT = "samu-lm"
# the file in a sharded checkpoint's folder that holds what is not model or optimizer state
SHARDED_META = "samu.pt"
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


def point_link(link, target: str) -> None:
    """Make ``link`` a symbolic link to ``target`` (a name in the same folder) in one step: a reader finds
    the old target or the new one, never no link."""
    link = Path(link)
    tmp = link.with_name(f".{link.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)
        _fsync(link.parent)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _write_failure(link, err) from None


def is_sharded(path) -> bool:
    """Whether ``path`` is a sharded checkpoint's folder (or a link to one)."""
    return (Path(path) / SHARDED_META).is_file()


def _training_state(model: nn.Module, optimizer) -> dict:
    """The model's and the optimizer's state as DCP saves and loads it (parameter names as keys; each
    process's own shards of a sharded model)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(unwrap(model), optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded(folder, model: nn.Module, optimizer, train_state: dict, is_main: bool) -> None:
    """Write a sharded checkpoint into the new folder ``folder``: every process of the group calls this, and
    the main one also writes ``samu.pt`` (format, version, config and ``train_state``) once every shard is
    down. A failure is a WriteError naming the folder."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    folder = Path(folder)
    model = unwrap(model)
    if not isinstance(model, CausalLM):
        raise TypeError(f"model must be a LanguageModel or a TransformerLM, got {type(model).__name__}")
    try:
        with warnings.catch_warnings():
            # without a process group this process saves alone, as intended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(_training_state(model, optimizer), checkpoint_id=folder)
    except (OSError, RuntimeError, CheckpointException) as err:
        raise _write_failure(folder / ".metadata", err) from None
    if dist.is_initialized():
        dist.barrier()
    if is_main:
        meta = {"format": FORMAT, "version": VERSION, "config": json.dumps(model.config.to_dict()),
                "train": train_state}
        atomic_write(folder / SHARDED_META, lambda tmp: torch.save(meta, tmp))
        _fsync(folder)


def _dcp_load(state: dict, folder: Path, alone: bool, what: str) -> None:
    """DCP's load of ``folder`` into ``state``: by every process of the group, or by this one ``alone`` (as it
    is anyway where there is no group; DCP then warns, and here that is the intent). A failure is a
    CheckpointError saying ``what`` did not load."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    alone = alone or not dist.is_initialized()
    try:
        with warnings.catch_warnings():
            if alone:
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, checkpoint_id=folder, no_dist=alone)
    # DCP's CheckpointException is a BaseException, not an Exception
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"{folder}: {what} does not load ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]})") from None


def load_sharded(folder, model: nn.Module, optimizer) -> None:
    """Load a sharded checkpoint's model and optimizer state into ``model`` and ``optimizer`` (built as the
    checkpoint's run built them, sharded or not, in any number of processes: all of them call this)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _training_state(model, optimizer)
    _dcp_load(state, Path(folder), alone=False, what="its model or optimizer state")
    set_state_dict(unwrap(model), optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def _read(path: Path, map_location="cpu", mmap: bool = False) -> dict:
    """A samu checkpoint file's payload as written (checkpoint.pt, or a sharded folder's samu.pt), or a
    CheckpointError naming the file."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt, truncated or not written "
                              f"by samu; {type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a samu language-model checkpoint")
    return payload


def load_checkpoint(path, map_location="cpu", weights: bool = True) -> dict:
    """The validated contents of a checkpoint (a file, or a sharded checkpoint's folder): keys format,
    version, config (LMConfig or TransformerConfig), model, train?, and ``sharded`` (its folder) for a
    sharded one, whose ``train`` holds no optimizer state (``load_sharded`` loads it) and which holds no
    ``model`` when ``weights`` is False (a file's tensors are then memory-mapped, not read)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a checkpoint file or folder (a str or path), got {type(path).__name__}")
    path = Path(path)
    if path.is_dir() and is_sharded(path):
        payload = _validated(path, _read(path / SHARDED_META), need_model=False)
        payload["sharded"] = path
        if weights:
            # the whole model, read by this process alone (in a process group too: no other rank need take part)
            state = {"model": build_model(payload["config"]).state_dict()}
            _dcp_load(state, path, alone=True, what="its weights")
            payload["model"] = state["model"]
        return payload
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    # without the weights, mapped rather than read: only what is touched comes from the disk
    return _validated(path, _read(path, map_location, mmap=not weights), need_model=True)


def _validated(path: Path, payload: dict, need_model: bool) -> dict:
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')!r}; "
                              f"this samu reads version {VERSION}")
    try:
        payload["config"] = model_config_from_dict(json.loads(payload["config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path} has an invalid model config: {e}") from None
    if need_model and not isinstance(payload.get("model"), dict):
        raise CheckpointError(f"{path} has no model state dict")
    return payload


def load_model(path, *, device=None, backend: str = "auto", payload: dict | None = None) -> CausalLM:
    """The model of a checkpoint's config (a LanguageModel or a TransformerLM), with its weights."""
    payload = load_checkpoint(path) if payload is None or "model" not in payload else payload
    model = build_model(payload["config"], backend=backend, device=device)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise CheckpointError(f"{path}: weights do not match the checkpoint's config ({first})") from None
    return model
