"""The ``samu`` command: demo, train, generate, compare, info (and bench, gate, report where installed).

A user error (a missing path, a corrupt checkpoint, an unknown preset, a bad number) prints one
line that names the flag and exits non-zero; nothing is written.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import json
import math
import os
import platform
import re
import sys
import time
from pathlib import Path

from samu import __version__, validate

DEMO_STEPS = 400
DEMO_PROMPT = "def "


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _number(kind, check):
    """An argparse type: the text as a ``kind``, accepted by the ``samu.validate`` function ``check``."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            return check(None, value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


positive_int = _number(int, validate.positive_int)
nonneg_int = _number(int, validate.nonneg_int)
nonneg_float = _number(float, validate.finite_number)


def _add_model_args(p):
    g = p.add_argument_group("model")
    g.add_argument("--preset", help="model preset: tiny, small or 400m (default tiny)")
    g.add_argument("--mixer", choices=("samu", "rglru"), help="temporal mixer (default samu)")
    g.add_argument("--width", type=positive_int, help="model width")
    g.add_argument("--layers", type=positive_int, dest="num_layers", help="number of residual layers")
    g.add_argument("--lru-width", type=positive_int, help="mixer width (default: the model width)")
    g.add_argument("--num-heads", type=positive_int, help="RG-LRU gate heads (default 16)")
    g.add_argument("--vocab-size", type=positive_int,
                   help="vocabulary size (default 256 for text, the largest token + 1 for token files)")


def _add_train_args(p):
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, help="optimizer steps (default 1000)")
    g.add_argument("--batch-size", type=positive_int, help="sequences per process and micro-step (default 16)")
    g.add_argument("--seq-len", type=positive_int, help="tokens per sequence (default 256)")
    g.add_argument("--grad-accum", type=positive_int, help="micro-steps per optimizer step (default 1)")
    g.add_argument("--lr", type=nonneg_float, help="peak learning rate (default 3e-3)")
    g.add_argument("--min-lr", type=nonneg_float, help="final learning rate of the cosine (default 3e-4)")
    g.add_argument("--warmup", type=nonneg_int, dest="warmup_steps", help="warm-up steps (default 50)")
    g.add_argument("--weight-decay", type=nonneg_float, help="AdamW weight decay on dense matrices (default 0.1)")
    g.add_argument("--grad-clip", type=nonneg_float, help="gradient-norm clip, 0 for none (default 1.0)")
    g.add_argument("--eval-every", type=positive_int, help="steps between validations (default 100)")
    g.add_argument("--eval-batches", type=positive_int, help="validation batches (default 8)")
    g.add_argument("--checkpoint-every", type=positive_int, help="steps between checkpoints (default 500)")
    g.add_argument("--keep", type=positive_int,
                   help="checkpoints kept: checkpoint.pt and the keep - 1 before it, as checkpoint-<step>.pt "
                        "(several processes: checkpoint-<step>/ folders, the link checkpoint to the last; default 2)")
    g.add_argument("--seed", type=nonneg_int, help="seed of the weights and the data order (default 0)")
    g.add_argument("--autocast", choices=("auto", "bf16", "none"), help="bf16 autocast (auto: on CUDA only)")
    g.add_argument("--backend", help="mixer backend: auto, torch, reference, triton or a variant")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--compile", action="store_const", const="on", dest="compile",
                   help="train through torch.compile (the default on CUDA)")
    c.add_argument("--no-compile", action="store_const", const="off", dest="compile",
                   help="train eagerly (the default on CPU)")
    g.add_argument("--activation-checkpointing", action="store_const", const=True, default=None,
                   help="recompute each layer's activations in the backward: less memory, ~1/3 more compute")
    g.add_argument("--no-deterministic", action="store_const", const=False, dest="deterministic",
                   help="without PyTorch's deterministic algorithms (on by default, at no measured cost): a compiled "
                        "run resumed on CUDA then differs from an uninterrupted one in the last bits")
    g.add_argument("--data-parallel", choices=("ddp", "fsdp"),
                   help="under torchrun: ddp (default) keeps the whole model in each process, fsdp shards every "
                        "layer's parameters, gradients and optimizer state over them (FSDP2)")
    g.add_argument("--pack", action="store_const", const=True, default=None,
                   help="packed batches: documents (the embedded corpus's files, a text folder's files) keep their "
                        "boundaries, so that no state crosses from one into the next")


def _add_runtime_args(p, threads=None):
    p.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--threads", type=positive_int, default=threads,
                   help=f"CPU threads (default {threads or 'chosen by torch'})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


MODEL_KEYS = ("mixer", "width", "num_layers", "lru_width", "num_heads", "vocab_size")
TRAIN_KEYS = ("data", "data_format", "steps", "batch_size", "seq_len", "grad_accum", "lr", "min_lr",
              "warmup_steps", "weight_decay", "grad_clip", "eval_every", "eval_batches", "checkpoint_every",
              "keep", "seed", "autocast", "backend", "device", "threads", "compile", "activation_checkpointing",
              "deterministic", "data_parallel", "pack")


# Names that messages from below the CLI may use, shown there as the flags that set them.
FIELDS = MODEL_KEYS + tuple(k for k in TRAIN_KEYS if k != "data") + (
    "out_dir", "max_new_tokens", "temperature", "top_k", "arms", "seeds", "long_seq_len", "long_tokens", "evals")
FLAGS = {"num_layers": "--layers", "warmup_steps": "--warmup", "out_dir": "--out"}
_FIELD = re.compile(r"(?<![\w/.\-'\"])(%s)(?=\s*(?:must\b|=|<=|>|\(|is\b|and\b|')|,)"
                    % "|".join(sorted(FIELDS, key=len, reverse=True)))


def with_flags(message: str) -> str:
    """``message`` with config field names (``lru_width must be even``) as flags (``--lru-width``)."""
    return _FIELD.sub(lambda m: FLAGS.get(m[1], "--" + m[1].replace("_", "-")), message)


def _given(args, keys) -> dict:
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _model_config(args, base=None):
    from samu.models import LMConfig, TransformerConfig

    overrides = _given(args, MODEL_KEYS)
    if isinstance(base, TransformerConfig):
        given = [FLAGS.get(k, "--" + k.replace("_", "-")) for k in overrides] + (["--preset"] if args.preset else [])
        if given:
            raise ValueError(f"{', '.join(given)}: this run folder holds a transformer (samu compare's reference "
                             f"point), whose shape a resume keeps; leave the model flags out")
        return base
    if args.preset is not None or base is None:
        return LMConfig.preset("tiny" if args.preset is None else args.preset, **overrides)
    return dataclasses.replace(base, **overrides)


def cmd_train(args):
    from samu.data import load_data
    from samu.models import load_checkpoint
    from samu.train import (TrainConfig, check_data_out, check_free, check_out_dir, current_checkpoint, is_finished,
                            train)

    out = check_out_dir(args.out)
    check_data_out(args.data or "stdlib", out)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if args.resume:
        if main_rank:   # rank 0 alone holds the folder's lock while it runs: other ranks may find it held
            check_free(out)
        path = current_checkpoint(out)
        payload = load_checkpoint(path, weights=False)
        if "train" not in payload:
            raise ValueError(f"{path} holds no training state to resume from")
        saved = TrainConfig.from_dict(json.loads(payload["train"]["config"]))
        model = _model_config(args, saved.model)
        config = dataclasses.replace(saved, model=model, out_dir=str(out), progress=not args.no_progress,
                                     **_given(args, TRAIN_KEYS))
        # train() loads the data, unless the run is finished and there is nothing to do.
        data = None
    else:
        config = TrainConfig(model=_model_config(args), out_dir=str(out), progress=not args.no_progress,
                             **_given(args, TRAIN_KEYS))
        data = load_data(config.data, config.data_format)
        if config.data_format != "text" and main_rank:
            print(f"data: {data.name}: {len(data.train) + len(data.val)} {config.data_format} tokens, vocabulary "
                  f"{data.vocab_size} (the largest id + 1)")
        if config.data_format != "text" and args.vocab_size is None:
            model = dataclasses.replace(config.model, vocab_size=data.vocab_size)
            config = dataclasses.replace(config, model=model)
    train(config, data=data, resume=args.resume)
    if not main_rank:
        return
    if args.resume and is_finished(payload, config):
        print(f"{out} holds a finished run ({config.steps} steps); nothing to do, nothing written")
    print(f"checkpoint: {current_checkpoint(out)}; log: {out / 'log.json'}")


def _decode(tokens, vocab_size) -> str:
    if vocab_size == 256:
        return bytes(tokens).decode("utf-8", errors="replace")
    return " ".join(map(str, tokens))


def _prompts(args, vocab_size):
    """One token tensor per --prompt-ids or --prompt (the demo prompt when neither is given)."""
    import torch

    if args.prompt_ids:
        prompts = []
        for text in args.prompt_ids:
            try:
                prompts.append([int(t) for t in text.replace(",", " ").split()])
            except ValueError:
                raise ValueError(f"--prompt-ids must be integers separated by spaces or commas, got {text!r}")
    else:
        if vocab_size != 256:
            raise ValueError(f"this model has a {vocab_size}-token vocabulary, not bytes; pass --prompt-ids")
        # the prompt's own bytes, even where they are not valid UTF-8 (argv decodes them with
        # surrogateescape)
        prompts = [list(text.encode("utf-8", "surrogateescape")) for text in args.prompt or [DEMO_PROMPT]]
    for ids in prompts:
        if not ids:
            raise ValueError("a prompt is empty; give at least one token")
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise ValueError(f"prompt token(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return [torch.tensor(ids, dtype=torch.long) for ids in prompts]


def cmd_generate(args):
    import torch

    from samu.models import generate, is_sharded, load_model
    from samu.train import current_checkpoint, resolve_device

    if args.prompt_ids and args.prompt:
        raise ValueError("give --prompt or --prompt-ids, not both")
    if not args.checkpoint.strip():
        raise ValueError("checkpoint must name a run folder or a checkpoint file, got ''")
    device = resolve_device(args.device or "auto")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    path = Path(args.checkpoint)
    if path.is_dir() and not is_sharded(path):
        path = current_checkpoint(path)
    model = load_model(path, device=device, backend=args.backend or "auto")
    if args.dtype:
        model.to(getattr(torch, args.dtype))
    vocab = model.config.vocab_size
    prompts = _prompts(args, vocab)
    stats: dict = {}
    # one prompt streams as chunks come, several print at the end; an interrupt or error keeps what came
    stream = _Stream(vocab, prompts[0].tolist()) if len(prompts) == 1 else None
    grown: list = []
    try:
        generate(model, prompts, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None,
                 seed=args.seed, stats=stats, on_tokens=stream.write_rows if stream else grown.append)
    except BaseException:
        if grown or (stream is not None and stream.prompt is None):   # something came
            _show(stream, prompts, grown, vocab)
        raise
    _show(stream, prompts, grown, vocab)
    if stats:
        print(f"prefill: {stats['prefill_tokens']} tokens, {_rate(stats['prefill_tokens'], stats['prefill_s'])}; "
              f"decode: {stats['decode_tokens']} tokens, {_rate(stats['decode_tokens'], stats['decode_s'])} "
              f"(batch {len(prompts)}, {device})", file=sys.stderr)


class _Stream:
    """One prompt's text printed as its tokens come: bytes through an incremental UTF-8 decoder (a character
    split between two chunks waits for its other part), ids space-separated."""

    def __init__(self, vocab_size: int, prompt: list):
        self.text = vocab_size == 256
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.prompt = prompt

    def write_rows(self, rows) -> None:
        self._write(rows[0].tolist())

    def _write(self, tokens: list) -> None:
        if self.prompt is not None:
            tokens, self.prompt = self.prompt + tokens, None
            start = ""
        else:
            start = "" if self.text else " "
        piece = self.decoder.decode(bytes(tokens)) if self.text else start + " ".join(map(str, tokens))
        sys.stdout.write(piece)
        sys.stdout.flush()

    def close(self) -> None:
        if self.prompt is not None:   # no token came
            self._write([])
        print(self.decoder.decode(b"", final=True) if self.text else "", flush=True)


def _show(stream, prompts, grown, vocab: int) -> None:
    """The streamed prompt's last line, or each prompt and the tokens it has grown (chunks [B, n] from generate's
    on_tokens)."""
    import torch

    if stream is not None:
        stream.close()
        return
    rows = torch.cat(grown, dim=1).tolist() if grown else [[] for _ in prompts]
    for i, (prompt, tokens) in enumerate(zip(prompts, rows)):
        if i:
            print("\n---")
        print(_decode(prompt.tolist() + tokens, vocab))


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:,.0f} tokens/s" if seconds > 0 else "n/a tokens/s"


def _check_demo_may_replace(out: Path) -> None:
    """samu demo replaces a run in ``out`` only if samu demo wrote it: as its checkpoint says, or where that is gone,
    its log (samu train refuses a folder holding kept checkpoints or a log without one)."""
    from samu.models import load_checkpoint
    from samu.train import LOG, _kept_steps, _read_log, current_checkpoint

    path = current_checkpoint(out)
    if not path.exists():
        path = out / LOG
        if not path.exists():
            kept = [p.name for _, p in sorted(_kept_steps(out).items())]
            if kept:
                raise FileExistsError(f"--out {out} holds {', '.join(kept)}, which samu demo did not write; samu "
                                      f"demo replaces only its own runs: choose another --out")
            return
    try:
        if path.name == LOG:
            demo = _read_log(path)["config"].get("demo", False)
        else:
            demo = json.loads(load_checkpoint(path, weights=False)["train"]["config"]).get("demo", False)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        demo = False
    if demo is not True:
        raise FileExistsError(f"--out {out} holds {path}, which samu demo did not write; samu demo replaces "
                              f"only its own runs: choose another --out")


def cmd_demo(args):
    import torch

    from samu.data import stdlib_cached, stdlib_corpus
    from samu.models import LMConfig, generate
    from samu.train import CHECKPOINT, TrainConfig, check_out_dir, resolve_device, train

    start = time.perf_counter()
    device = resolve_device(args.device or "auto")
    _check_demo_may_replace(check_out_dir(args.out))
    where = f"cpu ({args.threads} thread{'s' * (args.threads > 1)})" if device.type == "cpu" else str(device)
    if not stdlib_cached():
        print("building the byte-level corpus from this Python's standard library (once; it is cached)")
    data = stdlib_corpus()
    config = TrainConfig(model=LMConfig.preset("tiny", mixer=args.mixer), out_dir=args.out, steps=args.steps,
                         eval_every=max(1, args.steps // 4), checkpoint_every=args.steps,
                         warmup_steps=min(50, args.steps // 5), seed=args.seed, device=str(device),
                         threads=args.threads, progress=not args.no_progress, demo=True)
    print(f"training the tiny {args.mixer} model ({config.model.num_params() / 1e6:.2f}M parameters) for "
          f"{args.steps} steps of {config.batch_size} x {config.seq_len} bytes on {data.name} "
          f"({len(data.train) / 1e6:.1f} MB train, {len(data.val) / 1e3:.0f} kB validation) on {where}")
    result = train(config, data=data, overwrite=True)
    before, after = result.log["val"][0]["val_bpb"], result.log["val"][-1]["val_bpb"]
    print(f"validation bits/byte: {before:.3f} before training, {after:.3f} after {args.steps} steps "
          f"({before - after:.3f} lower)")
    print(f"checkpoint: {Path(args.out) / CHECKPOINT}")
    prompt = torch.tensor(list(DEMO_PROMPT.encode()))
    sample = generate(result.model, prompt, args.sample_bytes, temperature=0.8, top_k=40, seed=args.seed)
    print(f"sample (prompt {DEMO_PROMPT!r}, temperature 0.8, top-k 40):")
    print(_decode(sample.tolist(), 256))
    print(f"done in {time.perf_counter() - start:.0f} s")


def _count(text):
    """A token count >= 0: an integer, optionally with a K, M or G suffix (100M = 100,000,000)."""
    scale = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}.get(text[-1:].lower(), 1)
    digits = text[:-1] if scale > 1 else text
    try:
        value = float(digits) * scale
        whole = math.isfinite(value) and value == int(value) and value >= 0
    except (ValueError, OverflowError):
        whole = False
    if not whole:
        raise argparse.ArgumentTypeError(f"expected a whole token count such as 2000000 or 100M, got {text!r}")
    return int(value)


def _machine(env: dict) -> str:
    """A short name of the machine for a record's file name: the GPU's model ("h200"), else the device type."""
    words = [w for w in (env.get("gpu") or "").split() if w.lower() not in ("nvidia", "tesla", "geforce")]
    return re.sub(r"[^a-z0-9]+", "", words[0].lower()) if words else env.get("device") or "cpu"


COMPARE_KEYS = ("preset", "seeds", "seq_len", "tokens", "batch_size", "long_seq_len", "long_tokens", "data",
                "data_format", "lr", "min_lr", "evals", "eval_batches", "device", "compile")


def cmd_compare(args):
    import shlex

    from samu.bench.records import now
    from samu.environment import environment
    from samu.bench.report import compare_markdown, compare_plots
    from samu.compare import Study, recorded_in, run_study, write_record
    from samu.train import check_out_dir, resolve_device

    # both folders checked before the study trains (the record is written only once every run is done)
    for flag, folder in (("--out", args.out), ("--results", args.results)):
        try:
            check_out_dir(folder)
        except ValueError as e:
            raise ValueError(str(e).replace("out_dir", flag, 1)) from None
    fields = _given(args, COMPARE_KEYS)
    if args.arms is not None:
        fields["arms"] = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if args.long_tokens is None and "tokens" in fields:
        fields["long_tokens"] = fields["tokens"]
    study = Study(**fields)
    record = run_study(study, args.out, progress=not args.no_progress)
    env = environment(resolve_device(study.device))
    record.update(created=now(), command=shlex.join(["samu", *args.argv]), env=env)
    # the creation time in the name: a rerun (of one arm, say) never replaces an earlier record
    stamp = record["created"].replace("-", "").replace(":", "")
    stem = f"{stamp}-{_machine(env)}-{study.preset}-L{study.seq_len}"
    print("\n".join(compare_markdown(record)))
    known = recorded_in(record, args.results)
    if known is not None:
        print(f"record: {known} holds these runs already; nothing written")
        return
    path = write_record(record, Path(args.results) / f"{stem}.json")
    figures = compare_plots(record, args.results, stem)
    print(f"record: {path}; figures: {', '.join(str(f) for f in figures)}")


def cmd_info(args):
    import numpy
    import torch

    import samu
    from samu.ops import dispatch

    versions = [f"samu {samu.__version__}", f"python {platform.python_version()}", f"torch {torch.__version__}"]
    if dispatch.triton_available():
        import triton

        versions.append(f"triton {triton.__version__}")
    else:
        versions.append("triton not installed")
    versions.append(f"numpy {numpy.__version__}")
    print(" | ".join(versions))
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        print(f"device: cuda ({torch.cuda.device_count()}: {names})")
        targets = [("cuda", torch.bfloat16)]
    else:
        print(f"device: cpu ({torch.get_num_threads()} threads); CUDA not available")
        targets = [("cpu", torch.float32), ("cuda", torch.bfloat16)]
    triton = "not installed"
    if dispatch.triton_available():
        runs = torch.cuda.is_available() or dispatch.interpreting()
        triton = "runs here" if runs else "installed, runs on CUDA (or on CPU with TRITON_INTERPRET=1)"
    print(f"backends: reference, torch; triton {triton}")
    for op in dispatch.OPS:
        try:
            names = sorted(dispatch.variants(op))
            print(f"  {op} Triton variants: {', '.join(names) or 'none registered'}")
        except Exception as e:  # a broken kernel module should not hide the rest of the report
            print(f"  {op} Triton variants: unavailable ({type(e).__name__}: {e})")
    for device, dtype in targets:
        print(f"dispatch on {device}:")
        for op in dispatch.OPS:
            for shape in ((1, 2048, 1024), (4, 2048, 2048), (1, 32768, 1024)):
                try:
                    print("  " + dispatch.explain(shape, op, dtype, device))
                except Exception as e:  # a broken kernel module should not hide the rest of the report
                    print(f"  {op} {shape}: error ({type(e).__name__}: {e})")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="samu", description="Fast, exact recurrent sequence mixers (SAMU, RG-LRU) "
                                              "and the language models built on them.")
    parser.add_argument("--version", action="version", version=f"samu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="train the tiny model on the embedded corpus, report bits/byte, sample")
    p.add_argument("--steps", type=positive_int, default=DEMO_STEPS, help=f"training steps (default {DEMO_STEPS})")
    p.add_argument("--mixer", choices=("samu", "rglru"), default="samu", help="temporal mixer (default samu)")
    p.add_argument("--out", default="runs/demo",
                   help="output folder; a previous demo run there is replaced, any other run is kept "
                        "(default runs/demo)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed (default 0)")
    p.add_argument("--sample-bytes", type=nonneg_int, default=300, help="bytes to generate (default 300)")
    # The tiny model's ops are too small for intra-op threads to pay off, and spinning threads stall
    # badly when other processes share the cores.
    _add_runtime_args(p, threads=1)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a language model")
    p.add_argument("--data", help="'stdlib' (default: the embedded corpus), a text file or folder, "
                                  "or a token file")
    p.add_argument("--data-format", choices=("text", "uint16", "uint32"),
                   help="text (bytes, default) or a flat file of uint16/uint32 token ids")
    p.add_argument("--out", default="runs/train", help="run folder: checkpoint.pt, log.json (default runs/train)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly where it stopped (same --steps and schedule; "
                        "a finished run is left as it is)")
    _add_model_args(p)
    _add_train_args(p)
    _add_runtime_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="sample from a checkpoint")
    p.add_argument("checkpoint", help="a run folder or a checkpoint.pt written by samu train or samu demo")
    p.add_argument("--prompt", action="append",
                   help=f"text prompt for byte-level models (default {DEMO_PROMPT!r}); repeat it for a batch of "
                        f"prompts of any lengths")
    p.add_argument("--prompt-ids", action="append",
                   help="prompt as token ids, e.g. '12 7 99' (models with a token vocabulary); repeatable")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="cast the model to this dtype for generation (default: as saved, float32)")
    p.add_argument("--max-new-tokens", type=nonneg_int, default=300, help="tokens to generate (default 300)")
    p.add_argument("--temperature", type=nonneg_float, default=0.8, help="0 for greedy (default 0.8)")
    p.add_argument("--top-k", type=nonneg_int, default=40,
                   help="sample among the k likeliest, 0 for all (default 40)")
    p.add_argument("--seed", type=nonneg_int, help="seed for a reproducible sample")
    p.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--backend", help="mixer backend for the prompt (default auto)")
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads (default chosen by torch; one token's ops are small, so 1 is often faster)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("compare", help="SAMU, RG-LRU and transformer language models trained alike: validation "
                                       "bits/byte against tokens, time and position in the context")
    p.add_argument("--preset", help="model preset of every arm: tiny, small or 400m (default small)")
    p.add_argument("--arms", help="comma list of samu, rglru, transformer (default all three)")
    p.add_argument("--seeds", type=positive_int, help="seeds per arm at --seq-len (default 2)")
    p.add_argument("--seq-len", type=positive_int, help="context length of every arm (default 2048)")
    p.add_argument("--tokens", type=_count, help="training tokens a run, e.g. 100M (default 40M)")
    p.add_argument("--batch-size", type=positive_int, help="rows a step at --seq-len (default 16; the long pair "
                                                           "trains on as many tokens a step)")
    p.add_argument("--long-seq-len", type=nonneg_int, help="context length of the SAMU and RG-LRU pair at seed 0 "
                                                           "(default 8192; 0: no pair)")
    p.add_argument("--long-tokens", type=_count, help="training tokens of each long run (default --tokens)")
    p.add_argument("--data", help="'stdlib' (default: the embedded corpus), a text file or folder, or a token file")
    p.add_argument("--data-format", choices=("text", "uint16", "uint32"),
                   help="text (bytes, default: bits/byte) or a flat file of uint16/uint32 token ids (bits/token, "
                        "the vocabulary from the file)")
    p.add_argument("--lr", type=nonneg_float, help="peak learning rate of every run (default 3e-3)")
    p.add_argument("--min-lr", type=nonneg_float, help="final learning rate (default 3e-4)")
    p.add_argument("--evals", type=positive_int, help="validations a run, evenly spaced (default 12)")
    p.add_argument("--eval-batches", type=positive_int, help="batches a validation (default 8)")
    p.add_argument("--compile", choices=("auto", "on", "off"), help="torch.compile every run (default auto: on CUDA)")
    p.add_argument("--out", default="runs/compare",
                   help="study folder: study.json and one run folder per arm, length and seed; an unfinished "
                        "study there resumes (default runs/compare)")
    p.add_argument("--results", default="results/compare",
                   help="folder of the record (<time>-<gpu>-<preset>-L<len>.json) and its figures "
                        "(default results/compare)")
    p.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("info", help="versions, device, available backends and dispatch choices")
    p.set_defaults(func=cmd_info)

    try:
        from samu.bench import cli as bench_cli
    except ModuleNotFoundError as e:
        if e.name not in ("samu.bench", "samu.bench.cli"):
            raise
    else:
        bench_cli.add_commands(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = " ".join(str(message).split("\n"))
    print(text if text.startswith("samu") else f"samu: warning: {text}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    import warnings

    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning   # warnings as one line each (restored on return)
        return _run(args)


def _run(args) -> int:
    from samu.errors import TrainingDiverged, TrainingInterrupted

    try:
        return args.func(args) or 0
    except TrainingInterrupted as stop:
        if int(os.environ.get("RANK", "0")) != 0:
            # the main rank says how to resume and carries the stop's status: a failing status here would have
            # torchrun end the main rank, maybe before it says so
            return 0
        resume = f"--out {stop.out} --resume"
        # the study's folder resumes every arm, this one from its checkpoint
        how = ("the same `samu compare` command" if args.command == "compare"
               else f"the same torchrun command with `{resume}`" if int(os.environ.get("WORLD_SIZE", "1")) > 1
               else f"`samu train {resume}`")
        print(f"samu {args.command}: stopped by {stop}; the checkpoint is saved: resume with {how}", file=sys.stderr)
        return 128 + stop.signum
    except TrainingDiverged as e:
        print(f"samu {args.command}: error: {with_flags(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"samu {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError) as e:
        message = with_flags(str(e)) if args.command in ("demo", "train", "generate", "compare") else str(e)
        print(f"samu {args.command}: error: {message}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as e:
        # torch.OutOfMemoryError is a RuntimeError, as is the CPU allocator's refusal
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not isinstance(e, MemoryError) and "out of memory" not in text and "allocate memory" not in text:
            raise
        print(f"samu {args.command}: error: out of memory ({text[:200]}); try a smaller batch, sequence or model",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
