"""The ``bench``, ``gate`` and ``report`` subcommands; ``add_commands`` plugs them into ``samu``."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from samu.bench.peer_models import MODEL_PEERS
from samu.bench.scopes import PEER_IMPLS, SCOPES
from samu.bench.shapes import parse_shapes
from samu.validate import cpu_or_cuda

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def _dtype(text: str) -> torch.dtype:
    if text not in DTYPES:
        raise argparse.ArgumentTypeError(f"dtype must be one of {', '.join(DTYPES)}, got {text!r}")
    return DTYPES[text]


def _dtypes(text: str) -> list:
    return [_dtype(t.strip()) for t in text.split(",") if t.strip()]


def _shapes(text: str) -> list:
    try:
        return parse_shapes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _names(allowed=None):
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if allowed is not None:
            if items == ["all"]:
                return list(allowed)
            bad = [t for t in items if t not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; choose from {', '.join(allowed)} or all")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items
    return parse


def _at_least(minimum: int, why: str = ""):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{why}at least {minimum}, got {value}")
        return value
    return parse


def _device(text: str) -> torch.device:
    device = cpu_or_cuda(text)
    if device is None:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError("--device cuda asked for, but CUDA is not available here")
    return device


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _common(p: argparse.ArgumentParser):
    p.add_argument("--device", type=_device, default=_default_device(), help="cuda or cpu (default: cuda if present)")
    p.add_argument("--seed", type=int, default=0, help="base seed; each op/shape/dtype derives its own")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--strict", action="store_true", help="exit 1 when anything failed")


def add_commands(subparsers) -> None:
    """Add ``bench``, ``gate`` and ``report`` to an argparse subparsers object."""
    # no abbreviated options: --resume refuses the options a run takes from its record by their names
    b = subparsers.add_parser("bench", help="time mixers, blocks and training steps (JSON record)", allow_abbrev=False,
                              description="Counterbalanced timing, memory, launches and memory floor (docs/spec.md §8).")
    b.add_argument("--scopes", type=_names(SCOPES), default=["fwd", "fb"],
                   help=f"comma list of {', '.join(SCOPES)} or all (default: fwd,fb)")
    b.add_argument("--shapes", type=_shapes, default=parse_shapes("primary"),
                   help="comma list of set names (primary, length, width, block, step, gen, prefill, packed, "
                        "train, gate) or BxLxD; -NAME removes, e.g. length,width,-primary")
    b.add_argument("--dtype", type=_dtype, default=None, help="I/O dtype (default: bf16 on cuda, fp32 on cpu)")
    b.add_argument("--impls", type=_names(), default=["auto"],
                   help="samu backends to time: auto, torch, triton, variants (all registered) or variant names; "
                        "in the block, step and model scopes auto (eager) and compiled (torch.compile); in the "
                        "gen scope auto (CUDA graphs on CUDA) and eager")
    b.add_argument("--peers", type=_names(PEER_IMPLS + MODEL_PEERS + ("none",)), default=list(PEER_IMPLS + MODEL_PEERS),
                   help=f"peers timed beside the mixers ({', '.join(PEER_IMPLS)}) and the models "
                        f"({', '.join(MODEL_PEERS)}): a list, all (default) or none")
    b.add_argument("--warmup", type=_at_least(3, "docs/spec.md §8 asks for "), default=3,
                   help="warm-ups per round (>= 3)")
    b.add_argument("--samples", type=_at_least(5, "docs/spec.md §8 asks for "), default=5,
                   help="timed samples per round (>= 5)")
    b.add_argument("--check-finite", action="store_true",
                   help="keep samu's per-call parameter finiteness check (a host sync) in the timed calls")
    b.add_argument("--preset", default="400m", help="LMConfig preset of the model scope (its width must be D)")
    b.add_argument("--out", default="results/bench", help="record file (*.json) or folder (default: results/bench)")
    b.add_argument("--resume", default=None, metavar="RECORD",
                   help="continue the bench record (*.json) of a run cut short, in its own file and with that run's "
                        "own arguments, on the same machine and clean commit: what it finished is not timed again")
    _common(b)
    b.set_defaults(func=_bench)

    g = subparsers.add_parser("gate", help="run the docs/spec.md §7 correctness gates (JSON record + dispatch status)",
                              description="Compare backends with the float64 reference; thresholds from gates.toml.",
                              allow_abbrev=False)
    g.add_argument("--ops", type=_names(("samu", "rglru")), default=["samu", "rglru"])
    g.add_argument("--shapes", type=_shapes, default=parse_shapes("gate"),
                   help="comma list of set names or BxLxD (default: gate, every shape the benchmarks run a "
                        "sequence kernel at; gate your own training shapes to let dispatch use Triton there)")
    g.add_argument("--dtypes", type=_dtypes, default=[torch.bfloat16, torch.float16, torch.float32],
                   help="default: bf16,fp16,fp32 (a dtype left out keeps its Triton variants off in dispatch)")
    g.add_argument("--backends", type=_names(), default=["torch", "variants"],
                   help="torch, triton, variants (every registered Triton variant) or variant names")
    g.add_argument("--out", default=None, help="record file (*.json) or folder (default: results/gates)")
    g.add_argument("--resume", default=None, metavar="RECORD",
                   help="continue the gate record (*.json) of a run cut short, in its own file and with that run's "
                        "own arguments, on the same machine and clean commit: what it finished is not gated again")
    g.add_argument("--results", default="results",
                   help="records folder a named status (--status) is rebuilt from (the user's status: from the "
                        "records samu keeps in its cache folder)")
    g.add_argument("--status", default=None,
                   help="status file to write (default: $SAMU_GATE_STATUS, else gate_status.json in samu's "
                        "cache folder, rebuilt from the records samu keeps there; the packaged "
                        "samu/gates/status.json only when named)")
    g.add_argument("--jobs", type=_at_least(1), default=1,
                   help="compile the Triton variants' kernels for every gate unit in this many processes "
                        "first (Triton caches them for the gates; default 1: no warm-up)")
    g.add_argument("--warm-budget", type=float, default=300.0, help="seconds the warm-up may take (default 300)")
    g.add_argument("--heads", type=_at_least(1), default=None,
                   help="RG-LRU head count of the gated inputs (default: gates.toml's 16, or the largest divisor "
                        "of D below it); gate your model's own head count to let dispatch use Triton for it")
    g.add_argument("--documents", type=_at_least(1), default=None,
                   help="gate packed calls: each batch-1 shape packs this many sequences (cu_seqlens), the first "
                        "one token long, the others cut at random")
    g.add_argument("--no-status", action="store_true", help="write the record only")
    g.add_argument("--no-isolate", action="store_true",
                   help="gate in this process (default on CUDA: in a worker process, so a kernel fault fails "
                        "its row and the run goes on in a fresh one)")
    g.add_argument("--status-only", action="store_true",
                   help="only rebuild the status: the user's from samu's records folder after copying --results' "
                        "gate records there, a named one from --results")
    _common(g)
    g.set_defaults(func=_gate)

    r = subparsers.add_parser("report", help="regenerate results/REPORT.md and its figures from the records",
                              description="Deterministic: the same records give byte-identical output.")
    r.add_argument("--results", default="results", help="records folder (quarantine/ is never read)")
    r.add_argument("--out", default=None, help="report path (default: <results>/REPORT.md)")
    r.add_argument("--no-figures", action="store_true", help="write the Markdown only")
    r.add_argument("--brief", action="store_true", help="also print a short digest (SAMU vs RG-LRU, peers, gates)")
    r.set_defaults(func=_report)


def _command_line(args) -> str:
    return "samu " + shlex.join(getattr(args, "argv", None) or sys.argv[1:])


def _resume_alone(args, command: str, chosen: tuple) -> None:
    """With --resume, a one-line exit naming any option of ``chosen`` on the command line (a resumed run takes its own
    arguments and record file; the parsers take no abbreviations, so a name is the whole name), or a --resume that is
    not a .json file."""
    if args.resume is None:
        return
    given = {a.split("=")[0] for a in getattr(args, "argv", None) or sys.argv[1:]}
    named = [flag for flag in chosen if flag in given]
    if named:
        raise SystemExit(f"samu {command}: error: --resume continues its run with that run's own arguments and record "
                         f"file: drop {', '.join(named)}")
    if not str(args.resume).endswith(".json"):
        raise SystemExit(f"samu {command}: error: --resume {args.resume}: a {command} record is a .json file")


def _bench(args) -> int:
    from samu.bench.runner import bench_command

    _resume_alone(args, "bench", ("--scopes", "--shapes", "--dtype", "--impls", "--peers", "--warmup", "--samples",
                                  "--check-finite", "--preset", "--seed", "--out"))
    args.dtype = args.dtype or (torch.bfloat16 if args.device.type == "cuda" else torch.float32)
    args.peers = [p for p in args.peers if p != "none"]
    args.command_line = _command_line(args)
    return bench_command(args)


def _gate(args) -> int:
    from samu.gates.runner import gate_command

    _resume_alone(args, "gate", ("--ops", "--shapes", "--dtypes", "--backends", "--seed", "--heads", "--documents",
                                 "--out", "--status-only"))
    args.command_line = _command_line(args)
    return gate_command(args)


def _report(args) -> int:
    from samu.bench.report import report_command

    if not Path(args.results).is_dir():
        raise SystemExit(f"samu report: error: --results {args.results}: no such folder of records")
    return report_command(args)


def main(argv=None) -> int:
    """``python -m samu.bench {bench,gate,report} ...`` (the same commands as ``samu``)."""
    parser = argparse.ArgumentParser(prog="samu", description="samu measurement harness")
    add_commands(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    return int(args.func(args) or 0)
