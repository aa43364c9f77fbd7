"""Training loop: AdamW, warm-up + cosine schedule, clipping, accumulation, validation, checkpoints,
exact resume, a JSON log, and data-parallel training under ``torchrun`` (DDP, or FSDP2's fully_shard;
rank 0 logs).

Batches are drawn by a generator seeded from (seed, step, global micro-batch index), so the data
order is a function of the step alone: a resumed run sees exactly the batches the uninterrupted run
would have seen, 2 processes with ``grad_accum=1`` see the batches of 1 process with ``grad_accum=2``
(each process its own micro-batches: independent draws), and a run resumes on any number of processes
that keeps processes x grad_accum. One process writes ``checkpoint.pt``; a process group (several
processes, or one that shards) writes sharded checkpoints through torch.distributed.checkpoint
(``checkpoint-<step>/`` folders, the link ``checkpoint`` to the current one), which any number of
processes reads back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from samu.data import DATA_FORMATS, TokenData, load_data
from samu.environment import environment
from samu.errors import RunFolderBusy, TrainingDiverged, TrainingInterrupted
from samu.models import CausalLM, LMConfig, build_model, load_checkpoint, load_model, save_checkpoint
from samu.models.config import MODEL_CONFIGS, TransformerConfig, model_config_from_dict
from samu.models.checkpoint import (CheckpointError, WriteError, atomic_write, is_sharded, load_sharded,
                                    point_link, save_sharded, temporaries)
from samu.models.flops import mfu, peak_flops
from samu.modules import RecurrentBlock
from samu.modules.layers import Linear
from samu.ops import adamw
from samu.ops.checks import NonFiniteParameters, set_check_finite
from samu.ops.packing import sequence_offsets
from samu.paths import RUN_MARKER, FileLock
from samu.validate import cpu_or_cuda, finite_number, nonneg_int, positive_int

CHECKPOINT = "checkpoint.pt"
# a run of several processes: the link to its current sharded checkpoint, checkpoint-<step>/
SHARDED = "checkpoint"
LOG = "log.json"
DATA_PARALLEL = ("ddp", "fsdp")
AUTOCAST = ("auto", "bf16", "none")
COMPILE = ("auto", "on", "off")
# Fields that define the optimisation or its arithmetic: a resume must agree on them (others are logged if changed)
RUN_FIELDS = ("model", "data", "data_format", "steps", "batch_size", "seq_len", "lr",
              "min_lr", "warmup_steps", "weight_decay", "betas", "grad_clip", "seed", "pack", "autocast",
              "backend", "deterministic")
# cuBLAS's workspace setting, which PyTorch's strict deterministic mode demands (_deterministic sets it only then)
_CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"


@dataclass
class TrainConfig:
    """One training run. ``batch_size`` is per process and micro-step; tokens per step are
    batch_size * seq_len * grad_accum * world_size."""

    # an LMConfig (samu's recurrent model) or a TransformerConfig (the reference point, samu compare)
    model: "LMConfig | TransformerConfig" = field(default_factory=lambda: LMConfig.preset("tiny"))
    data: str = "stdlib"
    data_format: str = "text"
    out_dir: str = "runs/train"
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    checkpoint_every: int = 500
    # the current checkpoint and the keep - 1 before it (checkpoint-<step>.pt, or checkpoint-<step>/ folders)
    keep: int = 2
    log_every: int = 10
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    autocast: str = "auto"
    backend: str = "auto"
    # torch.compile the model for training: "auto" = on CUDA, "on", "off"
    compile: str = "auto"
    # recompute each layer's activations in the backward instead of keeping them (less memory, ~1/3 more compute)
    activation_checkpointing: bool = False
    # PyTorch's deterministic algorithms for the run (warn-only where an op has none; no cuBLAS workspace setting,
    # _deterministic): compiled on CUDA, a resumed run equals an uninterrupted one to the bit only with them
    # (results/dev/issue10/resume_check_1.txt, _2.txt: Inductor's kernels, the embedding gradient's scatter-add
    # among them, differ from run to run otherwise), at no measured cost (determinism_5/, _6/); False leaves
    # PyTorch's setting as the caller has it
    deterministic: bool = True
    # several processes (torchrun): "ddp" replicates the model in each, "fsdp" shards every layer's parameters,
    # gradients and optimizer state over them (FSDP2's fully_shard); the same training either way
    data_parallel: str = "ddp"
    # packed batches: a micro-batch's windows laid end to end with every document boundary kept
    # (TokenData.packed), so that no state or convolution crosses from one document into the next
    pack: bool = False
    # A progress bar; validation results are printed either way.
    progress: bool = True
    # Written by `samu demo`, which may replace a demo run but no other.
    demo: bool = False

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = model_config_from_dict(self.model)
        if not isinstance(self.model, MODEL_CONFIGS):
            raise TypeError(f"model must be an LMConfig or a TransformerConfig, got {type(self.model).__name__}")
        self.betas = tuple(self.betas)
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "eval_batches",
                     "checkpoint_every", "keep", "log_every"):
            positive_int(name, getattr(self, name))
        if self.threads is not None:
            positive_int("threads", self.threads)
        for name in ("warmup_steps", "seed"):
            nonneg_int(name, getattr(self, name))
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            finite_number(name, getattr(self, name))
        if self.min_lr > self.lr or self.lr == 0:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        if self.data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {', '.join(DATA_FORMATS)}, got {self.data_format!r}")
        if isinstance(self.data, os.PathLike):
            self.data = os.fspath(self.data)
        if not isinstance(self.data, str) or not self.data.strip():
            # an empty path would read as the working folder, every file under it as text
            raise ValueError(f"data must be 'stdlib' or the path of a text file, folder or token file, got "
                             f"{self.data!r}")
        if self.device != "auto":
            parse_device(self.device)
        if self.autocast not in AUTOCAST:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST)}, got {self.autocast!r}")
        if self.compile not in COMPILE:
            raise ValueError(f"compile must be one of {', '.join(COMPILE)}, got {self.compile!r}")
        if self.data_parallel not in DATA_PARALLEL:
            raise ValueError(f"data_parallel must be one of {', '.join(DATA_PARALLEL)}, got {self.data_parallel!r}")
        for name in ("activation_checkpointing", "deterministic", "pack"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**d)


class CosineSchedule:
    """Learning-rate multiplier: linear warm-up to 1, then a cosine down to ``min_ratio`` at ``total``."""

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.total, self.min_ratio = warmup, total, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False
    # a process group serves this run (of one process too, where it shards)
    grouped: bool = False

    def all_reduce(self, values: list[float], device, op) -> list[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def all_sum(self, values: list[float], device) -> list[float]:
        return self.all_reduce(values, device, dist.ReduceOp.SUM)

    def all_max(self, values: list[float], device) -> list[float]:
        return self.all_reduce(values, device, dist.ReduceOp.MAX)


def parse_device(name: str) -> torch.device:
    """``torch.device(name)``, or a ValueError naming the device argument."""
    device = cpu_or_cuda(name)
    if device is None:
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return device


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """"auto" is this process's GPU where CUDA is available, else the CPU."""
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = parse_device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r} requested but CUDA is not available")
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def _setup_distributed(config: TrainConfig, resume: bool) -> tuple[_Dist, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(config.device, local_rank)
    if device.type == "cpu":
        # Processes sharing a host share its cores.
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(config.threads or max(1, torch.get_num_threads() // local_world))
    # FSDP shards over a process group, of one process too (torchrun --nproc-per-node 1)
    if world == 1 and config.data_parallel != "fsdp":
        return _Dist(), device
    if world == 1 and not dist.is_initialized() and "MASTER_ADDR" not in os.environ:
        if not resume:
            raise ValueError("data_parallel is fsdp, which shards over the processes of torchrun: run under "
                             "torchrun (one process is enough to try it), or train one process unsharded (ddp)")
        # a sharded run resumed by one plain process: the same training, unsharded
        tqdm.write("resuming unsharded: one process, not under torchrun (data_parallel fsdp shards over "
                   "torchrun's processes)")
        return _Dist(), device
    owns = not dist.is_initialized()
    if owns:
        # Imported before the group exists. DDP's constructor imports torch._dynamo, which imports
        # modules (torch.distributed.nn.functional and others) whose functions take group.WORLD as a
        # default argument: imported once the group exists, those defaults hold it for good, so
        # destroy_process_group() frees nothing and gloo's worker threads run on into interpreter
        # shutdown, where one that releases a finished all_reduce's tensor takes the GIL and is ended
        # mid-destructor ("terminate called without an active exception"). Imported first, those
        # defaults are None, and destroy_process_group() joins the workers.
        import torch._dynamo as _  # noqa: F401  (as _: a plain import would make torch local here)
        # the same for what sharding and sharded checkpoints import
        import torch.distributed.checkpoint.state_dict as _state  # noqa: F401
        import torch.distributed.fsdp as _fsdp  # noqa: F401
        # bound to this rank's GPU: NCCL's barriers and collectives need not guess it
        cuda = device.type == "cuda"
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return _Dist(rank, world, local_rank, owns, grouped=True), device


def _compiles(config: TrainConfig, device: torch.device) -> bool:
    return config.compile == "on" or (config.compile == "auto" and device.type == "cuda")


def _choose_mixers(model: CausalLM, config: TrainConfig, device: torch.device) -> "str | None":
    """Each mixer's implementation at the training shape, chosen eagerly (gating its class where no record
    covers it), before torch.compile traces the model: dispatch never gates inside a trace. Returns why
    the model cannot be compiled (packed batches no kernel packs in one call), or None."""
    dtype = torch.bfloat16 if _autocasts(config, device) else next(model.parameters()).dtype
    blocks = [m for m in model.modules() if isinstance(m, RecurrentBlock)]
    if config.pack and not blocks:
        return "the transformer runs packed batches one call per sequence, which torch.compile cannot trace"
    # packed, a micro-batch is one row of batch_size * seq_len tokens
    shape = (1, config.batch_size * config.seq_len) if config.pack else (config.batch_size, config.seq_len)
    for block in blocks:
        choice = block.mixer.choose(*shape, dtype, device, packed=config.pack)
        if config.pack and choice.backend != "triton":
            return (f"packed batches compile only where a Triton variant packs them in one call, and here "
                    f"{choice.reason}")
    return None


def _autocasts(config: TrainConfig, device: torch.device) -> bool:
    return config.autocast == "bf16" or (config.autocast == "auto" and device.type == "cuda")


def _autocast(config: TrainConfig, device: torch.device):
    if _autocasts(config, device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _parameter_groups(model: CausalLM) -> list[list[tuple[str, nn.Parameter]]]:
    """The optimizer's two groups of (name, parameter): the dense matrices, which decay, and the rest
    (mixer parameters, norms and biases keep their scale)."""
    dense = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    named = list(model.named_parameters())
    return [[(n, p) for n, p in named if id(p) in dense], [(n, p) for n, p in named if id(p) not in dense]]


def _optimizer(model: CausalLM, config: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay, rest = ([p for _, p in group] for group in _parameter_groups(model))
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    # the fused CUDA kernel: one launch for every parameter, where the default walks them in a few dozen
    options = dict(lr=config.lr, betas=config.betas, fused=device.type == "cuda")
    if config.grad_clip and _adamw_kernels(device):
        optimizer = adamw.ClippedAdamW(groups, max_norm=config.grad_clip, **options)
        if adamw.unsupported(optimizer) is None:
            return optimizer
    return torch.optim.AdamW(groups, **options)


def _adamw_kernels(device: torch.device) -> bool:
    """Whether a clipped run steps on samu's AdamW kernels where they can (samu.ops.adamw): on CUDA, where they do
    what torch's fused AdamW and the norm before it do with ~1.6 GB a step less traffic for the 400m preset."""
    return device.type == "cuda"


@dataclass
class _LowCopy:
    layer: nn.Module      # a Linear
    weight: nn.Parameter  # its weight when the copy was made (the copy: the optimizer's low_copies[weight])
    version: int          # the weight's version counter when the copy was last made equal to it


class _LowWeights:
    """The run's Linear weights in bf16 for its bf16 autocast, written by the optimizer's step: a ClippedAdamW
    (samu.ops.adamw) writes a bf16 copy beside each weight it updates (2 bytes a parameter, 0.8 GB held for the 400m
    preset, where autocast's casts were made and freed layer by layer), where autocast would cast every weight again
    in the next forward (a read of 4 and a write of 2 bytes a parameter: ~0.6 ms a step for the 400m preset on an
    H200, results/dev/session8/call4). The copies are set on the layers (Linear.low_weight) for the loop only
    (``close`` takes them off). After each optimizer step the loop calls ``stepped`` (the step leaves every copy
    equal to its weight's cast); before every step and every validation it calls ``check``, which casts again every
    copy whose weight's version counter moved since (an in-place change by anything but the step) and refuses a
    weight replaced by another tensor. A write through ``.data`` or a raw pointer moves no version counter: nothing
    in the loop makes one. Empty without bf16 autocast or a ClippedAdamW."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, autocasts: bool,
                 closing: contextlib.ExitStack):
        self.optimizer = optimizer
        self.rows: list[_LowCopy] = []
        closing.callback(self.close)   # before any copy is set: none is left on a layer whatever happens
        if not (autocasts and isinstance(optimizer, adamw.ClippedAdamW)):
            return
        stepped = {p for group in optimizer.param_groups for p in group["params"]}
        for layer in model.modules():
            w = getattr(layer, "weight", None)
            if isinstance(layer, Linear) and w in stepped and w.dtype == torch.float32 and w.requires_grad:
                layer.low_weight = optimizer.keep_low_copy(w)
                self.rows.append(_LowCopy(layer, w, w._version))

    def stepped(self):
        # the step wrote the copies of the weights it updated (those with a gradient); any other copy keeps its
        # version, so that ``check`` still sees a change made to its weight since the last one
        for row in self.rows:
            if row.weight.grad is not None:
                row.version = row.weight._version

    def check(self):
        for row in self.rows:
            if row.layer.weight is not row.weight:
                raise RuntimeError("a Linear layer's weight was replaced during training; its bf16 copy would be "
                                   "stale (samu.train._LowWeights)")
            if row.weight._version != row.version:
                self.optimizer.low_copies[row.weight].copy_(row.weight.detach())
                row.version = row.weight._version

    def close(self):
        for row in self.rows:
            row.layer.low_weight = None
            self.optimizer.low_copies.pop(row.weight, None)
        self.rows = []


def _named_optimizer_state(model: CausalLM, state: dict) -> dict:
    """An optimizer state dict of ``_optimizer(model)`` (parameters by position) with parameter names as keys
    instead, as torch.distributed.checkpoint's set_state_dict takes a whole one to shard it."""
    names = [[n for n, _ in group] for group in _parameter_groups(model)]
    by_position = {}
    for group, group_names in zip(state["param_groups"], names):
        by_position.update(zip(group["params"], group_names))
    return {"state": {by_position[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": n} for g, n in zip(state["param_groups"], names)]}


def clipped_step(model: nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """One optimizer step on the gradients scaled down to a total norm of at most ``max_norm``; returns
    their total norm before (a device scalar). A ClippedAdamW (samu.ops.adamw) clips to its own max_norm, which
    must be this one; any other optimizer takes PyTorch's clip and step (samu.ops.adamw.torch_clipped_step)."""
    if isinstance(optimizer, adamw.ClippedAdamW):
        if optimizer.max_norm != max_norm:
            raise ValueError(f"max_norm is {max_norm}, but the ClippedAdamW clips to {optimizer.max_norm}")
        optimizer.step()
        return optimizer.grad_norm
    return adamw.torch_clipped_step(optimizer, [p for p in model.parameters() if p.grad is not None], max_norm)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on ``device``. To CUDA through pinned memory without waiting: a copy from pageable
    memory synchronises the host with the GPU, so that no step could be queued while the last one runs
    (PyTorch's pinned allocator keeps the staging buffer until its copy is done)."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def forward(model, x: torch.Tensor, cu_seqlens: torch.Tensor | None, compiled: bool = False) -> torch.Tensor:
    """The logits [B, L, V] of a batch x [B, L] (on the model's device); with ``cu_seqlens`` (TokenData.packed,
    on the host) its rows run as one packed row, every document on its own. A ``compiled`` model takes the
    offsets checked here and copied to the device (a trace cannot read them)."""
    if cu_seqlens is None:
        return model(x)[0]
    row = x.reshape(1, -1)
    if compiled:
        sequence_offsets(cu_seqlens, row)   # host values: no synchronisation
        cu_seqlens = to_device(cu_seqlens, x.device)
        # the number of documents changes from batch to batch: one graph for every count
        torch._dynamo.mark_dynamic(cu_seqlens, 0)
    else:
        # ints: an eager model (and DDP, which would copy a tensor to the GPU) reads them without a sync
        cu_seqlens = cu_seqlens.tolist()
    return model(row, cu_seqlens=cu_seqlens)[0].view(*x.shape, -1)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in nats, computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def _val_position_sums(model: CausalLM, data: TokenData, config: TrainConfig, device, rank: int, world: int,
                       autocast, lockstep: bool = False) -> tuple[torch.Tensor, int]:
    """Summed next-token loss (nats, fp32) at each position of this rank's validation windows, and their count.
    ``lockstep``: every rank runs as many forward calls as rank 0 (a sharded model gathers its parameters
    in each, with every rank), the ones past a rank's own windows on windows whose loss is not counted."""
    every = data.val_starts(config.seq_len, config.eval_batches * config.batch_size)
    starts = every[rank::world]
    calls = -(-len(every[0::world]) // config.batch_size) if lockstep else -(-len(starts) // config.batch_size)
    was_training = model.training
    model.eval()
    sums = torch.zeros(config.seq_len, dtype=torch.float64)
    for i in range(0, calls * config.batch_size, config.batch_size):
        rows = starts[i:i + config.batch_size]
        counted = len(rows) > 0
        rows = rows if counted else every[:config.batch_size]
        x, y = data.windows("val", rows, config.seq_len)
        cu_seqlens = data.packed("val", rows, config.seq_len) if config.pack else None
        with autocast or contextlib.nullcontext():
            logits = forward(model, x.to(device), cu_seqlens)
        if counted:
            per_token = F.cross_entropy(logits.float().transpose(1, 2), y.to(device), reduction="none")
            sums += per_token.sum(0).double().cpu()
    model.train(was_training)
    return sums, len(starts)


def to_bits(nats: float, bytes_per_token) -> float:
    """A loss in nats a token as bits a byte (byte-level data), else as bits a token."""
    return nats / math.log(2) / (bytes_per_token or 1)


def evaluate(model: CausalLM, data: TokenData, config: TrainConfig, device, *, rank: int = 0,
             world: int = 1, autocast=None, lockstep: bool = False) -> dict:
    """Validation loss (nats/token) over fixed windows, and bits per byte for byte-level data."""
    sums, windows = _val_position_sums(model, data, config, device, rank, world, autocast, lockstep)
    total, count = _Dist(rank, world).all_sum([float(sums.sum()), windows * config.seq_len], device)
    loss = total / count
    bits = {"val_bpb": to_bits(loss, data.bytes_per_token)} if data.bytes_per_token else {}
    return {"val_loss": loss, **bits}


def evaluate_positions(model: CausalLM, data: TokenData, config: TrainConfig) -> list[float]:
    """Validation loss (nats/token) at each position 0 .. seq_len - 1 of the windows ``evaluate`` reads,
    on the model's device under the run's autocast (one process): where a recurrent state shows what it
    kept, late positions against early ones."""
    device = next(model.parameters()).device
    sums, windows = _val_position_sums(model, data, config, device, 0, 1, _autocast(config, device))
    return (sums / windows).tolist()


@dataclass
class TrainResult:
    model: CausalLM
    log: dict


def _field(config: TrainConfig, name: str):
    """A run field as a resume compares it: a data path resolved (an older checkpoint may name it
    relative to the folder it ran in)."""
    value = getattr(config, name)
    return str(Path(value).resolve()) if name == "data" and value != "stdlib" else value


def check_resumable(saved: dict, config: TrainConfig, path: Path, has_identity: bool, saved_world: int = 1,
                    world: int = 1) -> None:
    """A CheckpointError naming what differs, unless ``config`` in ``world`` processes continues exactly the
    run ``saved`` (a TrainConfig's dict) of ``saved_world`` processes: the same settings and as many
    micro-batches a step (processes x grad_accum)."""
    saved = TrainConfig.from_dict(saved)
    if saved.model != config.model:
        raise CheckpointError(f"{path} holds a model {saved.model} but the run asks for {config.model}")
    # the data are compared by content where the checkpoint records it (train() checks that)
    fields = [f for f in RUN_FIELDS if f != "model" and not (f == "data" and has_identity)]
    differ = [f"{name} ({getattr(saved, name)!r} there, {getattr(config, name)!r} here)"
              for name in fields if _field(saved, name) != _field(config, name)]
    micro = saved.grad_accum * saved_world
    if config.grad_accum * world != micro:
        if micro % world == 0:
            fix = f"with {_processes(world)} use grad_accum={micro // world}"
        else:
            fix = f"no grad_accum fits {_processes(world)}: use a number of processes that divides {micro}"
        differ.append(f"micro-batches a step ({_processes(saved_world)} x grad_accum {saved.grad_accum} = {micro} "
                      f"there, {_processes(world)} x grad_accum {config.grad_accum} here; {fix})")
    if differ:
        raise CheckpointError(f"cannot resume {path} exactly: " + "; ".join(differ))


def _kept_steps(out: Path) -> dict[int, Path]:
    """The numbered checkpoints in a run folder, ``checkpoint-<step>.pt`` files and ``checkpoint-<step>/``
    folders, by step."""
    found = {}
    for path in out.glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-").removesuffix(".pt")
        if step.isdigit():
            found[int(step)] = path
    return found


def _processes(n: int) -> str:
    return f"{n} process{'es' if n != 1 else ''}"


def current_checkpoint(out) -> Path:
    """The checkpoint a run folder holds now: ``checkpoint.pt`` (written by one process) or the folder the
    link ``checkpoint`` points to (by a process group); where there are both (a run that changed its number
    of processes stopped between writing the one and removing the other), the later step's; with neither
    file nor link (a copy that dropped the link), the latest ``checkpoint-<step>/`` folder.
    ``out/checkpoint.pt`` when there is none."""
    out = Path(out)
    single, sharded = out / CHECKPOINT, out / SHARDED
    if not is_sharded(sharded):
        if single.exists():
            return single
        folders = {k: p for k, p in _kept_steps(out).items() if is_sharded(p)}
        return folders[max(folders)] if folders else single
    if not single.is_file():
        return sharded
    return max((single, sharded), key=_step_of)


def _step_of(path: Path) -> int:
    return load_checkpoint(path, weights=False)["train"]["step"]


def _log_of(path: Path) -> dict:
    """The log of the run that wrote checkpoint ``path`` (a file or a sharded folder), as saved with it."""
    return json.loads(load_checkpoint(path, weights=False)["train"]["log"])


def _of_run(path: Path, log: dict) -> bool:
    """Whether ``path`` is a checkpoint (a file or a sharded folder) written by the run of ``log`` (never, for a run
    from before run ids)."""
    if log.get("run_id") is None:
        return False
    try:
        return _log_of(path).get("run_id") == log["run_id"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CheckpointError):
        return False


def _kept_path(path: Path, log: dict) -> Path | None:
    """The name a checkpoint is kept under once another replaces it, ``checkpoint-<its step>.pt``, or None where
    that name is taken: by this run's own copy of the step (a save stopped between the two), left as it is, or by a
    file this run did not write, never overwritten (a warning says the step is not kept)."""
    kept = path.with_name(f"checkpoint-{_step_of(path)}.pt")
    if kept.exists() or kept.is_symlink():
        if not _of_run(kept, log):
            warnings.warn(f"{kept} is not this run's: the checkpoint it would have kept is not kept (samu never "
                          f"overwrites files it did not write)")
        return None
    return kept


def check_data_out(data: str, out_dir) -> None:
    """A run folder cannot be its own data folder (it would read its checkpoints as text once it
    holds them, and then refuse to resume on data that changed)."""
    if data != "stdlib" and Path(data).is_dir() and Path(data).resolve() == Path(out_dir).resolve():
        raise ValueError(f"out_dir {str(out_dir)!r} is the data folder: put the run folder elsewhere (a run "
                         f"folder inside the data folder is never read as text)")


def check_same_data(saved: dict, identity: dict, path: Path) -> None:
    # what the checkpoint recorded (one written before the document boundaries were part of it has no
    # documents' entries, and is checked on its tokens alone)
    for split in ("train", "val"):
        changed = [k for k in saved[split] if saved[split][k] != identity[split].get(k)]
        if changed:
            what = "its document boundaries" if all(k.startswith("documents") for k in changed) else "content"
            raise CheckpointError(
                f"cannot resume {path}: it trained on {saved['name']} ({saved['train']['tokens']} train tokens, "
                f"{saved['val']['tokens']} validation), but the data given now are {identity['name']} "
                f"({identity['train']['tokens']} and {identity['val']['tokens']}) and their {split} split differs "
                f"in {what}; resume with the same data")


def check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path if a run can be written there, else a ValueError naming it; creates nothing.

    It must not be an existing file, and its nearest existing ancestor must be a folder that takes files.
    """
    if not str(out_dir).strip():
        raise ValueError(f"out_dir must name a folder, got {str(out_dir)!r}")
    out = Path(out_dir)
    if out.is_symlink() and not out.exists():
        raise ValueError(f"out_dir {str(out)!r} is a link to nothing")
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} exists and is not a folder")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"out_dir {str(out)!r} cannot be created: {existing} is not a folder")
    try:
        # A nameless file, gone on close: os.access cannot tell (root passes it even on /proc).
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError:
        raise ValueError(f"out_dir {str(out)!r} is not writable: cannot create files in {existing}") from None
    return out


def _remove(path: Path) -> None:
    """Remove a checkpoint file, a sharded checkpoint's folder or the link to one, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def is_finished(payload: dict, config: TrainConfig) -> bool:
    """Whether the checkpoint ``payload`` holds a run that has done all of ``config.steps``."""
    return payload["train"]["step"] >= config.steps


class _RunFolder:
    """The run folder, held exclusively for a run's lifetime (rank 0 only; a lock the system drops
    when its holder dies, so a killed run's folder is taken over at once). Entering removes
    temporary files a killed save left behind. ``owned``: the folder was a samu run folder before;
    a run refused before it wrote anything (``wrote`` unset) leaves the folder as it found it."""

    def __init__(self, out: Path, rank: int):
        self.out, self.rank = out, rank
        self.owned = (out / RUN_MARKER).exists()
        self.created = not out.exists()
        self.lock, self.wrote = None, False

    def __enter__(self):
        if self.rank != 0:
            return self
        marker = self.out / RUN_MARKER
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f"out_dir {str(self.out)!r} cannot be created: {os.strerror(e.errno or 0)}") from None
        try:
            self.lock = FileLock(marker, wait=False).__enter__()
        except BlockingIOError:
            raise _busy(self.out) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
                raise OSError(f"out_dir {str(self.out)!r}: cannot lock {marker}: {os.strerror(e.errno or 0)}") from None
            # a file system without flock (some NFS, Lustre or FUSE mounts): run, unguarded
            warnings.warn(f"{marker} cannot be locked here ({os.strerror(e.errno)}): a second run into "
                          f"{self.out} would not be refused", stacklevel=3)
            marker.touch()
        for tmp in temporaries(self.out, "checkpoint*") + temporaries(self.out, LOG):
            _remove(tmp)
        return self

    def __exit__(self, kind, *exc):
        if self.rank != 0:
            return
        if kind is not None and not self.wrote and not self.owned:
            # removed while still held, so no later run can find this marker locked by a dead holder
            (self.out / RUN_MARKER).unlink(missing_ok=True)
        if self.lock is not None:
            self.lock.__exit__(kind, *exc)
        if kind is not None and not self.wrote and not self.owned and self.created:
            with contextlib.suppress(OSError):
                self.out.rmdir()


def _busy(out: Path) -> RunFolderBusy:
    return RunFolderBusy(f"out_dir {str(out)!r} is in use by another samu run (it holds {out / RUN_MARKER} "
                         f"locked); wait for it to finish or choose another output folder")


def check_free(out: Path) -> None:
    """A RunFolderBusy if a samu run holds ``out`` now (a resume asks before it reads the checkpoint)."""
    marker = out / RUN_MARKER
    if marker.exists():
        try:
            with FileLock(marker, wait=False):
                pass
        except BlockingIOError:
            raise _busy(out) from None
        except OSError:
            pass   # a file system without locks: the run itself says so


class _Signals:
    """SIGINT and SIGTERM ask the run to stop after its current step (a second one stops it at once)."""

    def __init__(self):
        self.signum, self.saved = None, {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self.saved.items():
            signal.signal(signum, handler)


def train(config: TrainConfig, *, data: TokenData | None = None, resume: bool = False,
          overwrite: bool = False) -> TrainResult:
    """Train the model of ``config.model`` (a LanguageModel, or a TransformerLM) as ``config`` says; writes
    checkpoints (``checkpoint.pt``, or sharded ones under a process group) and log.json to config.out_dir.

    resume: continue from out_dir's current checkpoint (same batches, same schedule as an uninterrupted run;
        so ``steps`` cannot change, nor processes x grad_accum), on the same data (checked by content). A
        finished run is returned as it is, and nothing is written.
    overwrite: start afresh even where out_dir already holds a checkpoint (otherwise an error).

    The folder is locked for the run. SIGINT or SIGTERM finishes the current step, saves a checkpoint
    and raises TrainingInterrupted; a non-finite loss or parameter raises TrainingDiverged before
    anything is saved. ``log.json`` is rewritten for every log step, a step later (at once where a step
    validates or saves: see _run).
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
    out = check_out_dir(config.out_dir)
    check_data_out(config.data, out)
    if config.data != "stdlib":
        config = dataclasses.replace(config, data=str(Path(config.data).resolve()))
    rank = int(os.environ.get("RANK", "0"))
    with _RunFolder(out, rank) as folder:
        return _train(config, data, resume, overwrite, out, folder)


def _read_log(path: Path) -> dict:
    """A run's log.json as a dict ({} where it cannot be read as one: refused as a run's, not trusted)."""
    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return log if isinstance(log, dict) else {}


def _check_fresh(out: Path, folder) -> None:
    """Before a new run in ``out``, which holds no current checkpoint: refuse what it would write over (kept
    checkpoints, a log of a run that saved checkpoints, a ``checkpoint`` that is not samu's link); the log of a run
    that saved none (killed before its first save, or stopped by divergence) is moved aside, to
    log-<its run id>.json."""
    kept = [p for _, p in sorted(_kept_steps(out).items())]
    link = out / SHARDED
    if link.exists() and not link.is_symlink():
        raise FileExistsError(f"{out} holds {link.name}, which samu never writes there (its sharded runs write a link "
                              f"of that name): choose another output folder")
    log = _read_log(out / LOG) if (out / LOG).exists() else None
    if kept or (log is not None and log.get("checkpoints") != []):
        found = ", ".join(p.name for p in ([out / LOG] if log is not None else []) + kept)
        raise FileExistsError(
            f"{out} holds {found} but no {CHECKPOINT}; samu never overwrites a run's files: choose another output "
            f"folder, or resume from a kept checkpoint (rename it to {CHECKPOINT}, then --resume), or remove them")
    if log is not None and folder.rank == 0:
        aside = out / f"log-{log.get('run_id') or uuid.uuid4().hex}.json"
        os.replace(out / LOG, aside)
        warnings.warn(f"{out / LOG} of a run that saved no checkpoint is kept as {aside.name}; a new run starts")


def _train(config, data, resume, overwrite, out, folder) -> TrainResult:
    ckpt_path = current_checkpoint(out)
    payload = None
    if resume:
        # a sharded checkpoint's weights and optimizer state are loaded once the model is built (and sharded)
        payload = load_checkpoint(ckpt_path, weights=False)
        if "train" not in payload:
            raise CheckpointError(f"{ckpt_path} holds no training state to resume from")
        saved_log = json.loads(payload["train"]["log"])
        saved_world = saved_log.get("world_size", 1)
        # a folder named as a later step's sharded checkpoint that this run did not write stops it now, not at that
        # save (a sharded save never removes another's folder)
        for step, path in _kept_steps(out).items():
            if step > payload["train"]["step"] and path.is_dir() and not _of_run(path, saved_log):
                raise FileExistsError(f"{path} is not this run's checkpoint, and the run would save one under its "
                                      f"name: move it away, then resume")
        check_resumable(json.loads(payload["train"]["config"]), config, ckpt_path, "data" in payload["train"],
                        saved_world, int(os.environ.get("WORLD_SIZE", "1")))
        if is_finished(payload, config):
            model = load_model(ckpt_path, device=resolve_device(config.device), backend=config.backend,
                               payload=payload)
            return TrainResult(model, json.loads(payload["train"]["log"]))
    elif ckpt_path.exists() and not overwrite:
        raise FileExistsError(f"{out} already holds a run ({ckpt_path}); resume it or choose another output folder")
    elif not ckpt_path.exists() and (out / LOG).exists() and not folder.owned:
        raise FileExistsError(f"{out} holds a {LOG} that no samu run folder owns; samu never overwrites "
                              f"files it did not write: choose another output folder")
    elif not overwrite:
        _check_fresh(out, folder)
    data = data if data is not None else load_data(config.data, config.data_format)
    data.check(config.seq_len)
    if config.pack:
        data.require_documents()
    if data.vocab_size > config.model.vocab_size:
        raise ValueError(f"the data has tokens up to {data.vocab_size - 1} but the model's vocab_size is "
                         f"{config.model.vocab_size}")
    identity = data.identity()
    if payload is not None and "data" in payload["train"]:
        check_same_data(payload["train"]["data"], identity, ckpt_path)
    elif payload is not None:
        # a checkpoint from before data identities: its log still has the token counts
        known = json.loads(payload["train"]["log"]).get("data", {})
        counts = {"train_tokens": len(data.train), "val_tokens": len(data.val)}
        if any(known.get(k, v) != v for k, v in counts.items()):
            raise CheckpointError(f"cannot resume {ckpt_path}: it trained on {known.get('train_tokens')} train and "
                                  f"{known.get('val_tokens')} validation tokens, the data given now have "
                                  f"{counts['train_tokens']} and {counts['val_tokens']}; resume with the same data")
    if overwrite and payload is None and folder.owned and folder.rank == 0:
        # a run being replaced (samu demo) takes its checkpoints with it, its current one too: its own, by run id
        old = _log_of(ckpt_path) if ckpt_path.exists() else _read_log(out / LOG)
        for old_kept in _kept_steps(out).values():
            if _of_run(old_kept, old):
                _remove(old_kept)
        if (out / SHARDED).is_symlink():
            _remove(out / SHARDED)
        _remove(out / CHECKPOINT)

    # train() sets the thread count for its run only.
    threads = torch.get_num_threads()
    # the run checks its loss and gradient norm every step on the device (read with the log) and its parameters
    # before every validation and save, so the mixers' per-call finiteness check, a host synchronisation each,
    # is off for it
    check = set_check_finite(False)
    ctx = _Dist()
    try:
        # the signals first: a Ctrl-C while _deterministic imports what it needs (a second or two) only asks the
        # run to stop, instead of breaking that import and the restore after it
        with _Signals() as signals, _deterministic(config.deterministic):
            ctx, device = _setup_distributed(config, payload is not None)
            with contextlib.ExitStack() as closing:
                return _run(config, data, identity, payload, ctx, device, folder, signals, closing)
    finally:
        torch.set_num_threads(threads)
        set_check_finite(check)
        if ctx.owns_group:
            # the run's engine, optimizer and work objects may sit in reference cycles that hold the group: freed
            # first, destroy_process_group() can drop the last reference and join gloo's worker threads
            gc.collect()
            dist.destroy_process_group()


@contextlib.contextmanager
def _deterministic(enabled: bool):
    """PyTorch's deterministic algorithms for a run (TrainConfig.deterministic), warn-only where an op has none
    unless the caller already had them strict; the caller's settings come back afterwards, whatever happened.

    cuBLAS's fixed workspace (CUBLAS_WORKSPACE_CONFIG) is set only for a strict caller, whom PyTorch would
    otherwise stop at the first product: a run on one stream repeats its products without it (a compiled run and
    its resumption agree to the bit, results/dev/issue10/resume_check_2.txt), and with it every product costs
    far more host time (results/dev/issue10/determinism_4/). PyTorch's warning about the unset workspace, raised
    at every product, is silenced for the run."""
    strict = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill, workspace = torch.utils.deterministic.fill_uninitialized_memory, os.environ.get(_CUBLAS_WORKSPACE)
    silenced = None
    try:
        if enabled:
            if strict and not warn_only and not torch.cuda.is_initialized():
                # cuBLAS reads the workspace when its first handle is made: a strict caller that used CUDA before
                # has to set it itself
                os.environ.setdefault(_CUBLAS_WORKSPACE, ":4096:8")
            # one filter, taken out again afterwards (the caller's own filters are left as they are)
            warnings.filterwarnings("ignore", message=f".*{_CUBLAS_WORKSPACE}.*")
            silenced = warnings.filters[0]
            torch.use_deterministic_algorithms(True, warn_only=warn_only or not strict)
            # but no NaN fill of every torch.empty (a pass over memory each): samu's kernels write their outputs
            # whole (their tests fill outputs with NaN first to show it)
            torch.utils.deterministic.fill_uninitialized_memory = False
        yield
    finally:
        torch.use_deterministic_algorithms(strict, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        if silenced is not None:
            with contextlib.suppress(ValueError):
                warnings.filters.remove(silenced)
        if workspace is None:
            os.environ.pop(_CUBLAS_WORKSPACE, None)
        else:
            os.environ[_CUBLAS_WORKSPACE] = workspace


def _run(config, data, identity, payload, ctx: _Dist, device, folder: _RunFolder, signals: _Signals,
         closing: contextlib.ExitStack) -> TrainResult:
    out = folder.out
    # Every rank builds the same initial weights from the seed.
    torch.manual_seed(config.seed)
    model = build_model(config.model, backend=config.backend).to(device)
    shard = config.data_parallel == "fsdp" and ctx.grouped
    if shard and config.pack and not any(isinstance(m, RecurrentBlock) for m in model.modules()):
        # its ranks would gather the parameters as many times as their micro-batches hold documents
        raise ValueError("data_parallel is fsdp, which cannot run the transformer's packed batches (one call per "
                         "document, a different number on each rank): train it with ddp, or unpacked")
    if shard:
        _fully_shard(model, device, ctx.world)
    # a run with a process group (several processes, or one that shards) saves sharded checkpoints, through
    # torch.distributed.checkpoint
    sharded = ctx.grouped
    optimizer = _optimizer(model, config, device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, CosineSchedule(config.warmup_steps, config.steps, config.min_lr / config.lr))
    start, time_before, train_before = 0, 0.0, 0.0
    # a run's identity: the same in every session of it, another in a run trained again alike
    log = {"run_id": uuid.uuid4().hex, "config": config.to_dict(), "params": model.num_params(),
           "world_size": ctx.world, "device": str(device), "cpu_threads": torch.get_num_threads(),
           "torch": torch.__version__,
           "env": environment(device),
           "data": {"name": data.name, "train_tokens": len(data.train), "val_tokens": len(data.val),
                    "identity": identity},
           "train": [], "val": [], "checkpoints": []}
    is_main = ctx.rank == 0
    if payload is not None:
        if "sharded" in payload:
            load_sharded(payload["sharded"], model, optimizer)
        elif any(k.endswith("block.linear_x.weight") for k in payload["model"]):
            raise CheckpointError(f"cannot resume {out / CHECKPOINT}: it was written before the block's W_x and W_y "
                                  f"became one GEMM (linear_in); its weights still load (samu generate, load_model) "
                                  f"but its optimizer state does not fit the new parameters, so training cannot "
                                  f"continue from it")
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            # one process's checkpoint, whole in every process (each keeps its shards of it where it shards)
            set_state_dict(model, optimizer, model_state_dict=payload["model"],
                           optim_state_dict=_named_optimizer_state(model, payload["train"]["optimizer"]),
                           options=StateDictOptions(full_state_dict=True))
        scheduler.load_state_dict(payload["train"]["scheduler"])
        start = payload["train"]["step"]
        log = json.loads(payload["train"]["log"])
        now, before = config.to_dict(), TrainConfig.from_dict(log["config"]).to_dict()
        changed = {k: [before[k], v] for k, v in now.items() if before[k] != v and k != "progress"}
        if changed:
            log["config_changes"] = log.get("config_changes", []) + [{"step": start, "changed": changed}]
            log["config"] = now
        log["resumed_at"] = log.get("resumed_at", []) + [start]
        log["resumed_env"] = log.get("resumed_env", []) + [environment(device)]  # the commit may differ
        log.update(world_size=ctx.world, device=str(device), cpu_threads=torch.get_num_threads())
        time_before = payload["train"].get("time_s", log["train"][-1]["time_s"] if log["train"] else 0.0)
        train_before = payload["train"].get("train_s", time_before)
        if is_main:
            tqdm.write(f"resuming {out} at step {start} of {config.steps}")
    model.activation_checkpointing = config.activation_checkpointing
    # after the weights are loaded, before anything traces the model
    lows = _LowWeights(model, optimizer, _autocasts(config, device), closing)
    engine = model
    if ctx.world > 1 and not shard:
        device_ids = [device.index] if device.type == "cuda" else None
        engine = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    compiled = _compiles(config, device)
    if compiled:
        why = _choose_mixers(model, config, device)
        if why is not None and config.compile == "on":
            raise ValueError(f"compile: {why}; train with compile='off' (--no-compile)")
        if why is not None:
            compiled = False
            if is_main:
                tqdm.write(f"training eagerly: {why}")
        else:
            engine = torch.compile(engine)
    log.update(compiled=compiled, activation_checkpointing=config.activation_checkpointing, packed=config.pack,
               optimizer_kernels=isinstance(optimizer, adamw.ClippedAdamW), bf16_weight_copies=bool(lows.rows))
    peak, params = peak_flops(device), model.num_params()
    autocast = _autocast(config, device)
    ckpt_path = out / (SHARDED if sharded else CHECKPOINT)
    # the first step (1-based) whose loss or gradient norm was not finite, 0 while none; kept on the
    # device so that checking it costs a synchronisation only where the loop reads values anyway
    bad_step = torch.zeros((), dtype=torch.long, device=device)

    def diverged(step):
        saved = log["checkpoints"][-1] if log["checkpoints"] else None
        kept = f"{ckpt_path} still holds step {saved}" if saved is not None else "no checkpoint was written"
        hint = "a lower lr" + ("" if config.grad_clip else " or gradient clipping (grad_clip=1)")
        return TrainingDiverged(f"training diverged at step {step}: the loss or the parameters became non-finite "
                                f"(nan or inf); the run stopped before saving them ({kept}). Start again with "
                                f"{hint}")

    def check_finite(step):
        # each rank checks its own shards; every rank stops if any finds one
        names = model.nonfinite_parameters()
        first, count = (int(v) for v in ctx.all_max([float(bad_step), float(len(names))], device))
        if first or count:
            error = diverged(first or step)
            if names:
                shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                error = TrainingDiverged(f"{error} (non-finite: {shown})")
            raise error

    def validate(step, elapsed, trained):
        check_finite(step)
        lows.check()
        # tokens trained on, the run's time so far (with its validations and saves) and its training time
        # alone (the steps, compilation included; without validations and saves)
        result = {"step": step, "tokens": step * tokens_per_step, "time_s": elapsed, "train_s": trained,
                  **evaluate(model, data, config, device, rank=ctx.rank, world=ctx.world, autocast=autocast,
                             lockstep=shard)}
        log["val"].append(result)
        if is_main:
            bpb = f", {result['val_bpb']:.3f} bits/byte" if "val_bpb" in result else ""
            tqdm.write(f"step {step}: validation loss {result['val_loss']:.4f} nats/token{bpb}")
        return result

    def agree(failed, what):
        """Every rank learns whether the main rank's part of saving ``what`` failed (else the others would wait
        for it at the next collective), and each raises then."""
        if ctx.all_max([float(failed is not None)], device)[0]:
            if failed is not None:
                raise failed
            raise WriteError(f"cannot write {what}: the main process failed to (its error is in its output)")

    def save(step, elapsed, trained):
        check_finite(step)
        log["checkpoints"].append(step)
        state = {"step": step, "scheduler": scheduler.state_dict(), "config": json.dumps(config.to_dict()),
                 "log": json.dumps(log), "data": identity, "time_s": elapsed, "train_s": trained}
        if is_main:
            folder.wrote = True
        failed = None
        if sharded:
            name = f"checkpoint-{step}"
            tmp = out / f".{name}.shards.tmp"
            if is_main:
                try:
                    _remove(tmp)
                    # a folder of this step that the link never reached (a run stopped between the two); one this
                    # run did not write stops it
                    if (out / name).exists() and not _of_run(out / name, log):
                        raise FileExistsError(f"{out / name} is not this run's checkpoint; samu never overwrites "
                                              f"files it did not write: move it away and resume")
                    _remove(out / name)
                except OSError as e:
                    failed = e
            agree(failed, out / name)
            try:
                # every rank writes its shards, then the main rank points the link at them: a reader finds
                # the previous checkpoint or this one, whole
                save_sharded(tmp, model, optimizer, state, is_main)
                if is_main:
                    os.replace(tmp, out / name)
                    point_link(out / SHARDED, name)
            except Exception as e:
                failed = e
        elif is_main:
            single = out / CHECKPOINT
            try:
                keep_as = _kept_path(single, log) if config.keep > 1 and single.exists() else None
                save_checkpoint(single, model, {**state, "optimizer": optimizer.state_dict()}, keep_as=keep_as)
            except Exception as e:
                failed = e
        if is_main and failed is None:
            try:
                write_log(out, log)
                # the other kind of checkpoint before this one (a run resumed on another number of processes)
                other = out / (CHECKPOINT if sharded else SHARDED)
                if sharded and other.is_file() and _of_run(other, log):
                    if config.keep > 1 and (keep := _kept_path(other, log)) is not None:
                        os.replace(other, keep)
                    else:
                        _remove(other)
                elif not sharded and other.is_symlink():
                    _remove(other)
                # only the checkpoints this run kept: never another checkpoint-<n>(.pt) in the folder; and a
                # sharded one of this run that the link never reached (a run stopped between the two)
                kept = set(log["checkpoints"][-config.keep:])
                for step_gone, path in _kept_steps(out).items():
                    if step_gone not in kept and (_of_run(path, log) or (
                            log.get("run_id") is None and step_gone in log["checkpoints"])):
                        _remove(path)
            except Exception as e:
                failed = e
        agree(failed, ckpt_path)

    tokens_per_step = config.batch_size * config.seq_len * config.grad_accum * ctx.world
    if start == 0:
        validate(0, 0.0, 0.0)
    bar = tqdm(total=config.steps, initial=start, disable=not (is_main and config.progress), unit="step",
               dynamic_ncols=True)
    postfix = {}
    model.train()
    t0 = time.perf_counter()
    # where the last interval's rate was read from: its step, host time and CUDA event, and the seconds spent
    # validating and saving since
    mark = {"step": start, "time": t0, "event": None, "paused": 0.0}
    pauses = 0.0   # seconds of this session spent validating and saving
    # A log step's values (loss, gradient norm, first bad step) travel to the host without waiting, and are read
    # one step later, when the next step is queued behind them: reading them at once would leave the GPU idle
    # while the host catches up (results/dev/session10/call1: 10-20 ms at every log step of the 400m preset)
    pending = None

    def send_log(done, lr, loss_sum, grad_norm, bad_step, elapsed):
        """A log step's values on their way to the host, and when it ended: a CUDA event on CUDA (where the host
        runs ahead of the GPU), else the host's clock."""
        norm = torch.full_like(loss_sum, float("nan")) if grad_norm is None else grad_norm.float()
        values = torch.stack([loss_sum.double(), norm.double(), bad_step.double()]).to("cpu", non_blocking=True)
        arrived = None
        if device.type == "cuda":
            arrived = torch.cuda.Event(enable_timing=True)
            arrived.record()
        return {"done": done, "lr": lr, "elapsed": elapsed, "values": values, "arrived": arrived,
                "sent_at": time.perf_counter()}

    def read_log(sent):
        """The log entry of a log step ``sent`` (send_log). Its interval's rate runs from the end of the last log
        step to the end of this one, less validating and saving: on the GPU's clock where both have an event."""
        if sent["arrived"] is not None:
            sent["arrived"].synchronize()
        done = sent["done"]
        loss_total, norm, bad = sent["values"].tolist()
        if ctx.all_max([bad], device)[0]:
            check_finite(done)   # raises, naming any non-finite parameter
        loss = ctx.all_sum([loss_total], device)[0] / (config.grad_accum * ctx.world)
        if sent["arrived"] is not None and mark["event"] is not None:
            seconds = mark["event"].elapsed_time(sent["arrived"]) / 1e3
        else:
            seconds = sent["sent_at"] - mark["time"]
        # over the steps since the last log step (the first interval includes compilation)
        rate = tokens_per_step * (done - mark["step"]) / max(seconds - mark["paused"], 1e-9)
        mark.update(step=done, time=sent["sent_at"], event=sent["arrived"], paused=0.0)
        entry = {"step": done, "loss": loss, "lr": sent["lr"], "time_s": sent["elapsed"],
                 "grad_norm": None if math.isnan(norm) else norm,
                 "tokens_per_s": tokens_per_step * (done - start) / (sent["sent_at"] - t0),
                 "recent_tokens_per_s": rate, "mfu": mfu(params, rate, peak, ctx.world)}
        log["train"].append(entry)
        postfix["loss"] = f"{loss:.3f}"
        postfix["tok/s"] = f"{rate / 1e3:.1f}K"
        if peak is not None:
            postfix["MFU"] = f"{entry['mfu']:.0%}"
        if is_main:
            folder.wrote = True
            write_log(out, log)

    def flush():
        """The pending log step's entry read and written now."""
        nonlocal pending
        if pending is not None:
            read_log(pending)
            pending = None

    for step in range(start, config.steps):
        lows.check()
        # Summed on the device: reading a loss back synchronises, so it happens a step after each log step.
        loss_sum = torch.zeros((), device=device)
        for micro in range(config.grad_accum):
            try:
                rng = np.random.default_rng([config.seed, step, ctx.rank * config.grad_accum + micro])
                x, y, cu_seqlens = data.sample(config.batch_size, config.seq_len, rng, config.pack)
                x, y = to_device(x, device), to_device(y, device)
                last = micro == config.grad_accum - 1
                if shard:
                    # gradients are reduced over the ranks after the last micro-batch only
                    model.set_requires_gradient_sync(last)
                sync = contextlib.nullcontext() if last or ctx.world == 1 or shard else engine.no_sync()
                with sync:
                    with autocast:
                        logits = forward(engine, x, cu_seqlens, compiled)
                    loss = cross_entropy(logits, y)
                    (loss / config.grad_accum).backward()
            except BaseException as error:
                if ctx.world == 1:
                    # the last log step's entry reaches log.json before the run stops (with more processes, each
                    # would wait in read_log's collectives for the others)
                    with contextlib.suppress(Exception):
                        flush()
                if isinstance(error, NonFiniteParameters):
                    # the previous update made a parameter non-finite
                    raise diverged(int(bad_step) or step) from None
                raise
            loss_sum += loss.detach()
        lr = optimizer.param_groups[0]["lr"]
        if config.grad_clip:
            grad_norm = clipped_step(model, optimizer, config.grad_clip)
        else:
            grad_norm = None
            optimizer.step()
        lows.stepped()
        finite = torch.isfinite(loss_sum) if grad_norm is None else torch.isfinite(loss_sum) & torch.isfinite(grad_norm)
        bad_step = torch.where((bad_step == 0) & ~finite, step + 1, bad_step)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        session = time.perf_counter() - t0
        elapsed, trained = time_before + session, train_before + session - pauses
        saved_now = False
        flush()
        evaluates = done % config.eval_every == 0 or done == config.steps
        saves = done % config.checkpoint_every == 0 or done == config.steps
        if done % config.log_every == 0 or done == config.steps:
            pending = send_log(done, lr, loss_sum, grad_norm, bad_step, elapsed)
            if evaluates or saves:
                # a validation or a save waits for the GPU anyway, and the log it writes holds this entry
                flush()
        # validation and saving do not count against the next interval's tokens/s and MFU
        paused = time.perf_counter()
        if evaluates:
            result = validate(done, elapsed, trained)
            postfix["val"] = f"{result.get('val_bpb', result['val_loss']):.3f}"
        if done == config.steps:
            log["done"] = True
        if saves:
            save(done, elapsed, trained)
            saved_now = True
        pause = time.perf_counter() - paused
        pauses += pause
        mark["paused"] += pause
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
        stop = signals.signum
        if ctx.world > 1:
            # the ranks stop together after the same step (one small collective a step)
            stop = int(ctx.all_max([float(stop or 0)], device)[0]) or None
        if stop and done < config.steps:
            flush()
            if not saved_now:
                save(done, elapsed, trained)
            bar.close()
            raise TrainingInterrupted(stop, done, config.steps, out)
    bar.close()
    if is_main and log["train"]:
        last = log["train"][-1]
        val = log["val"][-1] if log["val"] else {}
        bpb = f", {val['val_bpb']:.3f} bits/byte" if "val_bpb" in val else ""
        tqdm.write(f"done: {config.steps} steps, training loss {last['loss']:.4f}, validation loss "
                   f"{val.get('val_loss', float('nan')):.4f} nats/token{bpb}, {last['time_s']:.0f} s "
                   f"({last['tokens_per_s']:.0f} tokens/s in this session"
                   + (f", MFU {last['mfu']:.0%} over the last {config.log_every} steps" if last.get("mfu") else "")
                   + ")")
    return TrainResult(model, log)


def _fully_shard(model: CausalLM, device: torch.device, world: int) -> None:
    """Shard the model's parameters over the process group (FSDP2): each residual layer its own unit, whose
    parameters are gathered for its forward and backward only, then the embedding, final norm and tied head.
    The mesh is the run's device type's (FSDP's default takes CUDA's wherever CUDA exists, and a CPU run's rank
    1 on a one-GPU machine would ask for a second GPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def write_log(out: Path, log: dict) -> None:
    atomic_write(out / LOG, lambda tmp: Path(tmp).write_text(json.dumps(log, indent=1)))
