"""``samu compare``: does SAMU learn as well as RG-LRU? Language models of both mixers, and the transformer
reference point (samu.models.TransformerLM) of the same vocabulary, width and depth, trained on the same
data, the same tokens in the same order (a run's batches are drawn from its seed), the same schedule and
the same seeds, by samu's own trainer.

A study is a folder: ``study.json`` (its definition; another definition there is refused) and one run
folder per arm, length and seed. Cut short, it resumes: finished runs are kept, an unfinished one
continues exactly (samu train's resume), the rest start. The record (``<results>/<name>.json``) holds
every run's validation curve against tokens and run time, the final bits/byte, training tokens/s and the
loss by position in the context; samu.bench.report renders it (``compare_markdown``, ``compare_plots``;
the report regenerates its comparison section from the records).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from samu.models import LMConfig, TransformerConfig, load_checkpoint
from samu.models.checkpoint import atomic_write
from samu.train import to_bits
from samu.validate import nonneg_int, positive_int

ARMS = ("samu", "rglru", "transformer")
SCHEMA = "samu-compare/1"
POSITIONS = "positions.json"
# position bins of the loss-by-position table: the first 16 tokens of a window, then bins 4x wider
POSITION_EDGES = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)


@dataclass(frozen=True)
class Study:
    """What a study trains: each arm at ``seq_len`` with ``seeds`` seeds on ``tokens`` tokens a run, and a
    SAMU and RG-LRU pair (seed 0) at ``long_seq_len`` on ``long_tokens`` (0: none)."""

    preset: str = "small"
    arms: tuple[str, ...] = ARMS
    seeds: int = 2
    seq_len: int = 2048
    # 40M tokens: about 4 passes over the embedded corpus of a Python 3.12 standard library (10.6M training
    # bytes; the small models memorise it more with every pass, which a study of learning should not
    # measure), in well under 20 minutes of one H200 (docs/performance.md)
    tokens: int = 40_000_000
    batch_size: int = 16
    long_seq_len: int = 8192
    long_tokens: int = 40_000_000
    data: str = "stdlib"
    data_format: str = "text"
    lr: float = 3e-3
    min_lr: float = 3e-4
    evals: int = 12           # validations a run (evenly spaced), each over eval_batches batches
    eval_batches: int = 8
    device: str = "auto"
    compile: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "arms", tuple(self.arms))
        LMConfig.preset(self.preset)   # an unknown preset is a ValueError naming it
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms must be distinct names among {', '.join(ARMS)}, got {','.join(self.arms)}")
        for name in ("seeds", "seq_len", "tokens", "batch_size", "evals", "eval_batches"):
            positive_int(name, getattr(self, name))
        for name in ("long_seq_len", "long_tokens"):
            nonneg_int(name, getattr(self, name))
        if self.long_seq_len and self.long_tokens and self.long_seq_len <= self.seq_len:
            raise ValueError(f"long_seq_len must exceed seq_len={self.seq_len} (or be 0: no long pair), "
                             f"got {self.long_seq_len}")
        if self.tokens < self.batch_size * self.seq_len:
            raise ValueError(f"tokens must be at least one batch ({self.batch_size} x {self.seq_len}), "
                             f"got {self.tokens}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["arms"] = list(self.arms)
        return d

    def model(self, arm: str, vocab_size: int = 256):
        lm = LMConfig.preset(self.preset, vocab_size=vocab_size)
        if arm == "transformer":
            return TransformerConfig.like(lm)
        return dataclasses.replace(lm, mixer=arm)

    def runs(self) -> list[tuple[str, str, int, int, int]]:
        """(name, arm, seq_len, seed, tokens) of every run, in training order."""
        out = [(f"{arm}-L{self.seq_len}-s{seed}", arm, self.seq_len, seed, self.tokens)
               for seed in range(self.seeds) for arm in self.arms]
        if self.long_tokens and self.long_seq_len:
            out += [(f"{arm}-L{self.long_seq_len}-s0", arm, self.long_seq_len, 0, self.long_tokens)
                    for arm in ("samu", "rglru") if arm in self.arms]
        return out

    def train_config(self, arm: str, seq_len: int, seed: int, tokens: int, out_dir: Path, progress: bool,
                     vocab_size: int = 256):
        from samu.train import TrainConfig

        # about the same tokens a step at every length: fewer rows of longer windows (at least one)
        batch = max(1, self.batch_size * self.seq_len // seq_len)
        steps = max(1, math.ceil(tokens / (batch * seq_len)))
        every = math.ceil(steps / self.evals)
        return TrainConfig(model=self.model(arm, vocab_size), data=self.data, data_format=self.data_format,
                           out_dir=str(out_dir), steps=steps,
                           batch_size=batch, seq_len=seq_len, lr=self.lr, min_lr=self.min_lr,
                           warmup_steps=min(TrainConfig.warmup_steps, max(1, steps // 10)), eval_every=every,
                           eval_batches=self.eval_batches, checkpoint_every=every, log_every=max(1, min(10, every)),
                           seed=seed, device=self.device, compile=self.compile, progress=progress)


def _check_definition(folder: Path, study: Study) -> None:
    path = folder / "study.json"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved != study.to_dict():
            differ = ", ".join(f"{k} ({saved.get(k)!r} there, {v!r} here)" for k, v in study.to_dict().items()
                               if saved.get(k) != v)
            raise ValueError(f"{folder} holds another study ({differ}); resume it with its own options or "
                             f"choose another --out")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(study.to_dict(), indent=1)))


def run_study(study: Study, folder, progress: bool = True, say=print) -> dict:
    """Train every run of ``study`` under ``folder`` (resuming where it stopped) and return its record."""
    from samu.data import load_data
    from samu.train import current_checkpoint, evaluate_positions, is_finished, resolve_device, train

    folder = Path(folder)
    # everything a run needs is checked before the folder is claimed for this study
    data = load_data(study.data, study.data_format)
    vocab = 256 if study.data_format == "text" else data.vocab_size
    plan = [(name, arm, seq_len, seed, study.train_config(arm, seq_len, seed, tokens, folder / name, progress, vocab))
            for name, arm, seq_len, seed, tokens in study.runs()]
    for *_, config in plan:
        data.check(config.seq_len)
    _check_definition(folder, study)
    identity = data.identity()
    runs = []
    for i, (name, arm, seq_len, seed, config) in enumerate(plan, 1):
        out = Path(config.out_dir)
        ckpt = current_checkpoint(out)
        positions_path = out / POSITIONS
        kept = _finished_run(out, config, identity)
        resume = kept is None and ckpt.exists()
        finished = kept is not None or (resume and is_finished(load_checkpoint(ckpt, weights=False), config))
        if kept is None and not resume:
            positions_path.unlink(missing_ok=True)
        say(f"run {i}/{len(plan)}: {name} ({config.steps} steps of {config.batch_size} x {seq_len} "
            f"tokens){': finished, kept' if finished else ': resuming' if resume else ''}")
        if kept is not None:
            log, positions = kept
        else:
            if not finished:
                _reset_compiler()
            result = train(config, data=data, resume=resume)
            log = result.log
            saved = json.loads(positions_path.read_text()) if positions_path.exists() else {}
            if saved.get("step") == config.steps:
                positions = saved["loss"]
            else:
                positions = evaluate_positions(result.model.to(resolve_device(config.device)), data, config)
                record = {"step": config.steps, "loss": positions}
                atomic_write(positions_path, lambda tmp, r=record: Path(tmp).write_text(json.dumps(r)))
        runs.append(_run_entry(name, arm, seq_len, seed, config, log, positions, data.bytes_per_token))
    return summarize(study, runs, "bits/byte" if data.bytes_per_token else "bits/token")


def _finished_run(out: Path, config, identity: dict):
    """(log, loss by position) of a run folder whose run finished and whose positions are saved, else None.

    Such a run is kept from its ``log.json`` and ``positions.json`` alone: the record needs neither the
    model nor its checkpoints, which may be deleted (or left behind on another machine) once a run is done.
    A finished log of another run (its settings or data differ) is a CheckpointError naming them."""
    from samu.train import LOG, check_resumable, check_same_data

    try:
        log = json.loads((out / LOG).read_text())
        positions = json.loads((out / POSITIONS).read_text())
    except FileNotFoundError:
        return None
    if not log.get("done") or positions.get("step") != config.steps or "identity" not in log.get("data", {}):
        return None
    check_resumable(log["config"], config, out / LOG, has_identity=True, saved_world=log.get("world_size", 1))
    check_same_data(log["data"]["identity"], identity, out / LOG)
    return log, positions["loss"]


def _reset_compiler() -> None:
    """A fresh torch.compile state for each run, so that one arm's compiled graphs and recompile counts
    never shape another's speed."""
    import torch

    torch._dynamo.reset()


def _session_rates(log) -> list[float]:
    """Training tokens/s of each log interval, leaving out the first of each session (compilation)."""
    starts = [0, *log.get("resumed_at", [])]
    rates, entries = [], log["train"]
    for i, e in enumerate(entries):
        previous = entries[i - 1]["step"] if i else -1
        if not any(previous <= s < e["step"] for s in starts):
            rates.append(e["recent_tokens_per_s"])
    return rates


def _run_entry(name, arm, seq_len, seed, config, log, positions, bytes_per_token) -> dict:
    rates = _session_rates(log)
    return {"name": name, "arm": arm, "seq_len": seq_len, "seed": seed, "params": log["params"],
            "run_id": log.get("run_id"), "steps": config.steps, "batch_size": config.batch_size,
            "device": log.get("device"), "env": log.get("env"), "data": log.get("data"),
            "compiled": log.get("compiled"), "resumed_at": log.get("resumed_at", []),
            # the run's time: its steps (compilation included), validations and saves
            "time_s": log["val"][-1].get("time_s") if log["val"] else None,
            "val": [{"tokens": v.get("tokens"), "time_s": v.get("train_s"),
                     "bits": to_bits(v["val_loss"], bytes_per_token)}
                    for v in log["val"]],
            "tokens_per_s": statistics.median(rates) if rates else None,
            "position_bits": [to_bits(x, bytes_per_token) for x in positions]}


def _spread(values):
    """(mean, half the range) of the values given (None where there are none; the spread needs two)."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), ((max(values) - min(values)) / 2 if len(values) > 1 else None)


def _time_to(curve, target):
    """Training time at which a validation curve first reaches ``target`` bits (linear between points)."""
    for a, b in zip(curve, curve[1:]):
        if b["bits"] <= target:
            if a["bits"] <= target:
                return b["time_s"]
            return a["time_s"] + (a["bits"] - target) / (a["bits"] - b["bits"]) * (b["time_s"] - a["time_s"])
    return None


def position_bins(seq_len: int) -> list[tuple[int, int]]:
    edges = sorted({min(e, seq_len) for e in POSITION_EDGES} | {seq_len})
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def summarize(study: Study, runs: list[dict], unit: str = "bits/byte") -> dict:
    """The record: every run, and per (arm, length) the mean and half-range over seeds of the final bits,
    training tokens/s, bits by position, and the training time each run takes to reach the final bits of the
    RG-LRU run of its seed at the same length (with how many of the arm's runs reached it)."""
    groups = {}
    for r in runs:
        groups.setdefault((r["arm"], r["seq_len"]), []).append(r)
    rglru = {(r["seq_len"], r["seed"]): r["val"][-1]["bits"] for r in runs if r["arm"] == "rglru"}
    table = []
    for (arm, seq_len), rs in groups.items():
        bits, bits_spread = _spread([r["val"][-1]["bits"] for r in rs])
        rate, rate_spread = _spread([r["tokens_per_s"] for r in rs])
        paired = [r for r in rs if (seq_len, r["seed"]) in rglru]
        times = [_time_to(r["val"], rglru[(seq_len, r["seed"])]) for r in paired]
        time, time_spread = _spread(times)
        bins = []
        for a, b in position_bins(seq_len):
            mean, half = _spread([statistics.fmean(r["position_bits"][a:b]) for r in rs])
            bins.append({"from": a, "to": b, "bits": mean, "spread": half})
        table.append({"arm": arm, "seq_len": seq_len, "seeds": [r["seed"] for r in rs], "params": rs[0]["params"],
                      "bits": bits, "bits_spread": bits_spread, "tokens_per_s": rate,
                      "tokens_per_s_spread": rate_spread,
                      "time_to_rglru_s": time, "time_to_rglru_spread_s": time_spread,
                      "reached_rglru": sum(t is not None for t in times), "paired_with_rglru": len(paired),
                      "position_bins": bins})
    return {"schema": SCHEMA, "study": study.to_dict(), "unit": unit, "table": table, "runs": runs}


def _run_keys(record: dict) -> set:
    """Its runs: the run ids of their logs, or, for runs logged without one, their validation curves."""
    return {r.get("run_id") or json.dumps([v["bits"] for v in r["val"]]) for r in record["runs"]}


def _same_runs(a: dict, b: dict) -> bool:
    """Whether two records share a run (the same training, summarised twice)."""
    return bool(_run_keys(a) & _run_keys(b))


def recorded_in(record: dict, folder) -> "Path | None":
    """A record in ``folder`` that summarises exactly ``record``'s runs (a finished study run again), or None."""
    for path in sorted(Path(folder).glob("*.json")):
        try:
            other = json.loads(path.read_text())
            if isinstance(other, dict) and "study" in other and _run_keys(other) == _run_keys(record):
                return path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def is_rerun_of(record: dict, study: dict) -> bool:
    """Whether the ``samu compare`` record ``record`` reruns (part of) the earlier record ``study``: the same
    definition but for as many or fewer arms and seeds, and the same long pair or none; created after it,
    and training its runs anew (a record that keeps the study's own runs, such as the one a finished study
    writes again, is no rerun)."""
    a, b = record["study"], study["study"]
    same = all(a.get(k) == b.get(k) for k in {*a, *b} - {"arms", "seeds", "long_seq_len", "long_tokens"})
    return (same and set(a["arms"]) <= set(b["arms"]) and a["seeds"] <= b["seeds"]
            and (not (a["long_seq_len"] and a["long_tokens"])
                 or (a["long_seq_len"], a["long_tokens"]) == (b["long_seq_len"], b["long_tokens"]))
            and record.get("created", "") > study.get("created", "") and not _same_runs(record, study))


def study_of(record: dict, records: list[dict]) -> "dict | None":
    """The earliest of ``records`` that ``record`` reruns, or None (then it is a study of its own)."""
    studies = [s for s in records if s is not record and is_rerun_of(record, s)]
    return min(studies, key=lambda s: s.get("created", "")) if studies else None


def rerun_rows(record: dict, study: dict) -> list[dict]:
    """Each (arm, length) of the rerun ``record`` beside the same row of ``study``: whether the rerun's mean
    final bits lie within the study's reported spread (mean ± half the range over its seeds; None where the
    study has one seed)."""
    rows = {(t["arm"], t["seq_len"]): t for t in study["table"]}
    out = []
    for t in record["table"]:
        s = rows.get((t["arm"], t["seq_len"]))
        if s is None:
            continue
        within = None if s["bits_spread"] is None else abs(t["bits"] - s["bits"]) <= s["bits_spread"]
        out.append({"arm": t["arm"], "seq_len": t["seq_len"], "seeds": t["seeds"], "bits": t["bits"],
                    "bits_spread": t["bits_spread"], "study_bits": s["bits"], "study_spread": s["bits_spread"],
                    "within": within})
    return out


def write_record(record: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))
    return path
