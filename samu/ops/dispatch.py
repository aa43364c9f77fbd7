"""Backend and variant selection per shape, gate-aware (spec §5, §6).

Backends: ``"reference"`` (serial, exact, slow), ``"torch"`` (chunked PyTorch, any device),
``"triton"`` (the dispatched Triton variant) or a named Triton variant. ``"auto"`` picks Triton on
CUDA when it is importable and a variant has passed its gate for the shape class, else ``"torch"``.

Triton variants register themselves here (``register``) with their own preference rule. ``"auto"``
and ``"triton"`` choose only among variants whose gate status for the shape class is "passed"
(``samu.ops.gate_status``): a variant that failed there is never chosen. A class no status covers
is gated once, on first use, in a child process (``samu gate`` at the call's own shape; the
result goes to the user's status file and one line on stderr says so); ``SAMU_AUTO_GATE=0`` turns
that off (a one-time warning names the command instead), and inside a torch.compile trace or a
CUDA-graph capture an ungated class is an error naming the command. A variant named explicitly
runs regardless, so it can be gated.

Packed calls (``packed``: cu_seqlens, samu.ops.packing) choose among the variants that pack (``packs``)
by their packed classes (gated with ``samu gate --documents``); where none has passed, or the backend
is torch or reference, the call runs one sequence at a time ("per_sequence"), each sequence through
this same dispatch as a call of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from samu.ops import gate_status
from samu.paths import FileLock

OPS = ("samu", "rglru")
BASE_BACKENDS = ("auto", "reference", "torch", "triton")


@dataclass(frozen=True)
class Variant:
    """A Triton implementation of one op with fixed numerics (chunk length, prefix scheme)."""

    op: str
    name: str
    run: Callable = field(compare=False, repr=False)
    # preference(B, L, D, H) -> lower is better, or None where the variant does not apply
    preference: Callable[[int, int, int, int], "float | None"] = field(compare=False, repr=False)
    # scratch(B, L, D) -> (formula, bytes): transient prefix/summary scratch of one forward+backward
    scratch: Callable[[int, int, int], "tuple[str, int]"] = field(compare=False, repr=False)
    description: str = ""
    # settings(B, L, D, H, dtype) -> the launch settings (tile sizes, groups) it uses for such a call
    settings: Callable[..., str] = field(compare=False, repr=False, default=lambda B, L, D, H, dtype: "")
    # numerics(B, L, D, H, dtype) -> the settings that fix its parenthesisation there (part of the gate class)
    numerics: Callable[..., str] = field(compare=False, repr=False, default=lambda B, L, D, H, dtype: "")
    # run(..., cu_seqlens=offsets) runs packed sequences in one call (samu.ops.packing)
    packs: bool = False
    # run(..., final=False) skips the final state (returns None for it) for a caller that drops it
    drops_final: bool = False
    # a UTC time: older gate records gated other numerics under the same class names (the status leaves them out)
    gated_since: str = ""
    # the same for its packed classes alone, where only packed calls' bits moved
    packed_gated_since: str = ""


@dataclass(frozen=True)
class Choice:
    backend: str             # "reference" | "torch" | "triton" | "per_sequence" (packed calls only)
    variant: "Variant | None"
    reason: str

    @property
    def name(self) -> str:
        return self.variant.name if self.variant is not None else self.backend


_VARIANTS: dict[str, dict[str, Variant]] = {op: {} for op in OPS}


def register(variant: Variant) -> Variant:
    _VARIANTS[variant.op][variant.name] = variant
    _classes.clear()
    _chosen.clear()
    return variant


def variants(op: str) -> dict[str, Variant]:
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    _load_triton()
    return dict(_VARIANTS[op])


_found: dict = {}  # plain dicts rather than functools.lru_cache: torch.compile traces them quietly


def triton_available() -> bool:
    if "triton" not in _found:
        try:
            import triton  # noqa: F401
            _found["triton"] = True
        except ImportError:
            _found["triton"] = False
    return _found["triton"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _load_triton() -> None:
    if "variants" not in _found:
        if triton_available():
            import samu.ops.rglru.function  # noqa: F401  (registers RG-LRU variants)
            import samu.ops.samu.function  # noqa: F401  (registers SAMU variants)
        _found["variants"] = True


# the suffix of a packed call's class
PACKED_CLASS = "|packed"


def shape_class(L: int, D: int, dtype: torch.dtype, numerics: str = "", packed: bool = False) -> str:
    """The unit a gate record speaks for: dtype, a length bucket, a width bucket and, for a Triton
    variant, the settings that fix its parenthesisation at that shape (spec §6: numerics are part of
    the variant, so a gate passed with other settings does not speak for these); packed calls are
    classes of their own."""
    length = "L<=8192" if L <= 8192 else "L<=32768" if L <= 32768 else "L>32768"
    width = "D<=1024" if D <= 1024 else "D>1024"
    return (f"{str(dtype).replace('torch.', '')}|{length}|{width}" + (f"|{numerics}" if numerics else "")
            + (PACKED_CLASS if packed else ""))


# (op, variant name, B, L, D, H, dtype) -> gate class, so eager calls compute it once per shape
_classes: dict = {}


def gate_class(variant: Variant, B: int, L: int, D: int, H: int, dtype: torch.dtype, packed: bool = False) -> str:
    """The shape class of ``variant`` at (B, L, D) with H heads (H matters to RG-LRU only)."""
    if torch.compiler.is_compiling():
        # traced once per graph; a memo lookup there would add a guard and a recompile per shape
        return shape_class(L, D, dtype, variant.numerics(B, L, D, H, dtype), packed)
    key = (variant.op, variant.name, B, L, D, H, dtype, packed)
    if key not in _classes:
        if len(_classes) > 4096:
            _classes.clear()
        _classes[key] = shape_class(L, D, dtype, variant.numerics(B, L, D, H, dtype), packed)
    return _classes[key]


def _dname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# sequences a packed gate packs (fewer where L is shorter)
GATE_DOCUMENTS = 16


def gate_command(op: str, B: int, L: int, D: int, dtype: torch.dtype, heads: int, names=None,
                 packed: bool = False) -> list[str]:
    """The ``samu gate`` arguments that gate ``op``'s variants (all, or ``names``) at one shape."""
    cmd = ["samu", "gate", "--ops", op, "--shapes", f"{B}x{L}x{D}", "--dtypes", _dname(dtype)]
    cmd += ["--backends", ",".join(names) if names else "variants"]
    cmd += ["--documents", str(min(L, GATE_DOCUMENTS))] if packed else []
    return cmd + (["--heads", str(heads)] if op == "rglru" else [])


def auto_gate_enabled() -> "str | None":
    """None when ``auto`` may gate an uncovered class itself, else why not."""
    if os.environ.get("SAMU_AUTO_GATE", "1") == "0":
        return "SAMU_AUTO_GATE=0"
    if gate_status.override() is not None:
        return f"SAMU_GATE_STATUS names the one status file in use ({gate_status.override()})"
    return None


def _can_gate(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def _in_trace_or_capture() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


_auto_tried: dict = {}  # (op, classes tried) -> outcome of this process's attempt to gate them


def _gate_now(op: str, B: int, L: int, D: int, H: int, dtype: torch.dtype, device: torch.device, names,
              packed: bool = False, fallback: "str | None" = None) -> None:
    """Gate ``names`` at this shape in a child process (a kernel fault there cannot poison this
    one), record the result in the user's status file and reload the status. One process gates a
    class at a time (a lock in the cache folder): ranks of one job wait for the first. Says so in
    one line on stderr, and once more only when the gate did not pass (naming ``fallback``, the gated variant
    that then runs, if any)."""
    classes = {n: gate_class(_VARIANTS[op][n], B, L, D, H, dtype, packed) for n in names}
    key = (op, tuple(sorted(classes.values())))
    if key in _auto_tried:
        return
    records = gate_status.user_records()
    records.mkdir(parents=True, exist_ok=True)
    shown = " ".join(gate_command(op, B, L, D, dtype, H, names, packed))
    with FileLock(records / ".lock"):
        gate_status.reload()
        if all(gate_status.verdict(op, n, c, device) for n, c in classes.items()):
            _auto_tried[key] = "gated by another process"
            return
        print(f"samu: no gate record covers {op} at ({B}, {L}, {D}) {_dname(dtype)} on this GPU; gating it once "
              f"(`{shown}`) into {gate_status.user_file()}", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "samu.bench", *gate_command(op, B, L, D, dtype, H, names, packed)[1:], "--quiet",
               "--device", str(device), "--out", str(records), "--results", str(records),
               "--status", str(gate_status.user_file())]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                                  env=dict(os.environ, SAMU_AUTO_GATE="0"))
            output = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
            failed = done.returncode != 0 and output[-1]
        except (OSError, subprocess.TimeoutExpired) as err:
            output, failed = [], f"{type(err).__name__}: {err}"
        gate_status.reload()
    verdicts = {n: gate_status.verdict(op, n, c, device) for n, c in classes.items()}
    _auto_tried[key] = failed or verdicts
    if failed or "passed" not in verdicts.values():
        said = failed or "; ".join(f"{n} {v or 'not gated'}" for n, v in verdicts.items())
        hint = "" if failed or all(verdicts.values()) else f" ({' | '.join(output[-3:])})"
        uses = f"the gated {fallback}" if fallback else "the chunked PyTorch path (~100x slower)"
        print(f"samu: gating {op} at ({B}, {L}, {D}) {_dname(dtype)}: {said}{hint}; it uses {uses} for that class "
              f"in this process", file=sys.stderr, flush=True)


_warned: set = set()


def triton_unusable(device: torch.device) -> "str | None":
    """None when Triton can run on this device, else the reason it cannot."""
    if not triton_available():
        return "triton is not installed"
    if device.type != "cuda" and not interpreting():
        return f"tensors are on {device.type} (Triton needs CUDA, or TRITON_INTERPRET=1 on CPU)"
    if device.type == "cuda" and torch.version.hip:
        # some kernels carry NVIDIA PTX (prefetch, fast math), and none was gated on AMD GPUs
        return "this is a ROCm build of PyTorch; samu's kernels are written and gated for NVIDIA GPUs"
    return None


# (op, B, L, D, dtype, device, backend, heads, gate, packed) -> (gate_status.generation(), Choice): the Triton
# choices of eager calls on a CUDA device where no ungated variant was in play (so no gating, warning or trace
# could have changed them), remembered because an eager mixer call cannot afford choose's ~20-35 us each time
_chosen: dict = {}


def choose(op: str, B: int, L: int, D: int, dtype: torch.dtype, device, backend: str = "auto",
           heads: int = 16, gate: bool = True, packed: bool = False) -> Choice:
    """Resolve ``backend`` for one call; raises ValueError for an unknown or unusable backend.
    ``heads``: RG-LRU's head count (its head dim is part of the gate class). ``gate``: gate a class
    no record covers (False: only say so). ``packed``: a packed call (B = 1), module docstring.

    A settled choice for a CUDA device with its index is remembered per argument set until the gate status is read
    again (``gate_status.reload``) or a variant registers: verdicts change only through those two."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string, got {type(backend).__name__}")
    if torch.compiler.is_compiling():
        # a trace resolves afresh: a lookup in _chosen would add a guard on it
        return _choose(op, B, L, D, dtype, device, backend, heads, gate, packed)[0]
    key = (op, B, L, D, dtype, device, backend, heads, gate, packed)
    hit = _chosen.get(key)
    if hit is not None and hit[0] == gate_status.generation():
        return hit[1]
    choice, settled = _choose(op, B, L, D, dtype, device, backend, heads, gate, packed)
    # a CUDA device with its index: "cuda" alone would mean whichever device is current
    if settled and isinstance(device, torch.device) and device.type == "cuda" and device.index is not None:
        if len(_chosen) > 4096:
            _chosen.clear()
        _chosen[key] = (gate_status.generation(), choice)
    return choice


def _choose(op, B, L, D, dtype, device, backend, heads, gate, packed) -> "tuple[Choice, bool]":
    """choose's work: the choice, and whether the same arguments give it again until the status is read again."""
    device = torch.device(device)
    if backend in ("reference", "torch"):
        return Choice(backend, None, f"backend={backend!r} requested"), True
    if backend == "auto" and device.type != "cuda":
        return Choice("torch", None, f"auto: {device.type} device, using the chunked PyTorch path"), True
    unusable = triton_unusable(device)
    if backend == "auto" and unusable:
        return Choice("torch", None, f"auto: {unusable}, using the chunked PyTorch path"), True
    named = variants(op) if triton_available() else {}
    if backend not in BASE_BACKENDS and backend not in named:
        options = ", ".join(repr(b) for b in (*BASE_BACKENDS, *sorted(named)))
        raise ValueError(f"backend must be one of {options}; got {backend!r}")
    if unusable:
        raise ValueError(f"backend={backend!r} cannot run: {unusable}")
    if dtype == torch.float64:
        if backend == "auto":
            return Choice("torch", None, "auto: float64 input, using the chunked PyTorch path"), True
        raise TypeError(f"backend={backend!r} supports bf16, fp16 and fp32 inputs, not float64")
    if backend in named:
        if packed and not named[backend].packs:
            return Choice("per_sequence", None, f"variant {backend!r} does not pack: one call per sequence"), True
        return Choice("triton", named[backend], f"variant {backend!r} requested"), True
    applicable = [v for v in named.values() if v.preference(B, L, D, heads) is not None and (v.packs or not packed)]
    classes = {v.name: gate_class(v, B, L, D, heads, dtype, packed) for v in applicable}

    def verdicts():
        return {v.name: gate_status.verdict(op, v.name, classes[v.name], device) for v in applicable}

    def ranking():
        # sorted by a key of constants: torch.compile can neither sort the Variants nor take min's default
        return sorted(((v.preference(B, L, D, heads), v.name, v) for v in applicable if status[v.name] == "passed"),
                      key=lambda r: (r[0], r[1]))

    status = verdicts()
    ranked = ranking()
    # an ungated variant matters where none has passed, or where it would rank before the best that has
    ungated = [n for n, s in status.items() if s is None
               and (not ranked or (named[n].preference(B, L, D, heads), n) < ranked[0][:2])]
    # with an ungated variant in play, the same call may gate, warn or (traced) refuse: not remembered
    settled = not ungated
    tracing = _in_trace_or_capture()
    passed_over = ungated if ranked and (tracing or not gate) else []
    if passed_over:
        ungated = []   # a trace takes the best gated variant; explain() names the one a first call would gate
    if ungated:
        command = " ".join(gate_command(op, B, L, D, dtype, heads, ungated, packed))
        where = "; ".join(f"{n} in {classes[n]}" for n in ungated)
        why_not = auto_gate_enabled()
        can_gate = why_not is None and _can_gate(device)
        if tracing and (can_gate or (op, classes[ungated[0]]) not in _warned):
            # an eager call would gate here, or warn that it takes the PyTorch path; a trace can do neither
            # (after that warning it takes the path the eager call took)
            raise RuntimeError(f"no gate record covers {op} at (B={B}, L={L}, D={D}) {_dname(dtype)} ({where}), and "
                               f"samu never gates inside torch.compile or a CUDA-graph capture: run `{command}` "
                               f"first (or one eager call), or pass a backend")
        if not gate:
            return Choice("torch", None, f"{backend}: no gate record covers this class ({where}); the first call "
                                         f"gates it (`{command}`)" + ("" if why_not is None else
                                                                      f", unless {why_not}")), settled
        if can_gate:
            _gate_now(op, B, L, D, heads, dtype, device, ungated, packed, ranked[0][1] if ranked else None)
            status = verdicts()
            ranked = ranking()
        elif backend == "auto" and not tracing and (op, classes[ungated[0]]) not in _warned:
            _warned.add((op, classes[ungated[0]]))
            fallback = (f"the gated {ranked[0][1]}, which ranks after it" if ranked
                        else "the chunked PyTorch path there, ~100x slower")
            warnings.warn(f"samu: no gate record covers {op} at (B={B}, L={L}, D={D}) {_dname(dtype)} ({where}) and "
                          f"{why_not or 'CUDA is not available'}, so {op} uses {fallback}; `{command}` gates it",
                          stacklevel=3)
    if not ranked:
        wanted = "; ".join(f"{n} in {classes[n]}: {status[n] or 'not gated'}" for n in status) or "no variant applies"
        command = " ".join(gate_command(op, B, L, D, dtype, heads, packed=packed))
        if packed and backend != "triton":
            if not _in_trace_or_capture() and (op, "packed", L, D, dtype) not in _warned:
                _warned.add((op, "packed", L, D, dtype))
                warnings.warn(f"samu: no Triton variant has passed the packed gate of {op} at (L={L}, D={D}) "
                              f"{_dname(dtype)} ({wanted}), so its packed calls run one call per sequence, far "
                              f"slower for many short sequences; `{command}` gates it", stacklevel=3)
            return Choice("per_sequence", None, f"{backend}: no Triton variant has passed its packed gate here "
                                                f"({wanted}; `{command}` gates it); one call per sequence"), settled
        if backend == "triton":
            raise ValueError(f"no Triton variant of {op} has passed its gate here ({wanted}); run "
                             f"`{command}`, or name a variant")
        torch_failed = gate_status.verdict(op, "torch", shape_class(L, D, dtype), device) == "blocked"
        return Choice("torch", None, f"auto: no Triton variant has passed its gate here ({wanted}; "
                                     f"`{command}` gates it); using the chunked PyTorch path"
                                     + ("; it failed its own gate in this class" if torch_failed else "")), settled
    score, name, v = ranked[0]
    others = ", ".join(n for _, n, _ in ranked[1:]) or "none"
    before = ""
    if passed_over and not gate:   # explain() only: a trace builds no such text
        why_not = auto_gate_enabled()
        before = "".join(f"; {n} would rank before it but no record covers {classes[n]} (an eager call gates it"
                         + (f", unless {why_not})" if why_not else ")") for n in passed_over)
    return Choice("triton", v, f"{backend}: {name} ranks first for (B={B}, L={L}, D={D}) "
                               f"in {classes[name]}; gated alternatives: {others}{before}"), settled


def explain(shape, op: str = "samu", dtype: torch.dtype = torch.bfloat16, device="cuda",
            backend: str = "auto", heads: int = 16, packed: bool = False) -> str:
    """Say which implementation ``op`` uses for ``shape`` = (B, L, D) (``packed``: a packed row), with which
    launch settings, and why. It only looks: a class no record covers is reported, not gated (choose checks op)."""
    if (not isinstance(shape, (tuple, list)) or len(shape) != 3
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in shape)):
        raise ValueError(f"shape must be (B, L, D), three positive integers, got {shape!r}")
    B, L, D = shape
    if op == "samu" and D % 2:
        raise ValueError(f"shape: SAMU's width D must be even, got {D}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    c = choose(op, B, L, D, dtype, device, backend, heads, gate=False, packed=packed)
    settings = f"; launch settings: {c.variant.settings(B, L, D, heads, dtype)}" if c.variant is not None else ""
    return (f"{op} {tuple(shape)} {str(dtype).replace('torch.', '')} on {torch.device(device).type}: "
            f"{c.name} ({c.reason}{settings})")
