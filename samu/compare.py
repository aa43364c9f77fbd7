"""``samu compare``: does SAMU learn as well as RG-LRU? Language models of both mixers, and the transformer
reference point (samu.models.TransformerLM) of the same vocabulary, width and depth, trained on the same
data, the same tokens in the same order (a run's batches are drawn from its seed), the same schedule and
the same seeds, by samu's own trainer.

A study is a folder: ``study.json`` (its definition; another definition there is refused) and one run
folder per arm, length and seed. Cut short, it resumes: finished runs are kept, an unfinished one
continues exactly (samu train's resume), the rest start. The record (``<results>/<name>.json``) holds
every run's validation curve against tokens and run time, the final bits/byte, training tokens/s and the
loss by position in the context; ``plots`` and ``markdown`` render it (the report regenerates its
comparison section from the records).
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
from samu.validate import positive_int

ARMS = ("samu", "rglru", "transformer")
SCHEMA = "samu-compare/1"
# position bins of the loss-by-position table: the first tokens of a window, then decades of context
POSITION_EDGES = (0, 16, 128, 1024, 8192, 65536)


@dataclass(frozen=True)
class Study:
    """What a study trains: each arm at ``seq_len`` with ``seeds`` seeds on ``tokens`` tokens a run, and a
    SAMU and RG-LRU pair (seed 0) at ``long_seq_len`` on ``long_tokens`` (0: none)."""

    preset: str = "small"
    arms: tuple[str, ...] = ARMS
    seeds: int = 2
    seq_len: int = 2048
    tokens: int = 100_000_000
    batch_size: int = 16
    long_seq_len: int = 8192
    long_tokens: int = 100_000_000
    data: str = "stdlib"
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
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.tokens < self.batch_size * self.seq_len:
            raise ValueError(f"tokens must be at least one batch ({self.batch_size} x {self.seq_len}), "
                             f"got {self.tokens}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["arms"] = list(self.arms)
        return d

    def model(self, arm: str):
        lm = LMConfig.preset(self.preset)
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

    def train_config(self, arm: str, seq_len: int, seed: int, tokens: int, out_dir: Path, progress: bool):
        from samu.train import TrainConfig

        # the same tokens a step at every length: fewer rows of longer windows
        batch = max(1, self.batch_size * self.seq_len // seq_len)
        steps = max(1, math.ceil(tokens / (batch * seq_len)))
        every = max(1, steps // self.evals)
        return TrainConfig(model=self.model(arm), data=self.data, out_dir=str(out_dir), steps=steps,
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
    from samu.train import CHECKPOINT, evaluate_positions, is_finished, resolve_device, train

    folder = Path(folder)
    _check_definition(folder, study)
    data = load_data(study.data)
    runs = []
    for i, (name, arm, seq_len, seed, tokens) in enumerate(study.runs(), 1):
        out = folder / name
        config = study.train_config(arm, seq_len, seed, tokens, out, progress)
        ckpt = out / CHECKPOINT
        resume = ckpt.exists()
        finished = resume and is_finished(load_checkpoint(ckpt), config)
        say(f"run {i}/{len(study.runs())}: {name} ({config.steps} steps of {config.batch_size} x {seq_len} "
            f"tokens){': finished, kept' if finished else ': resuming' if resume else ''}")
        result = train(config, data=data, resume=resume)
        positions_path = out / "positions.json"
        if positions_path.exists():
            positions = json.loads(positions_path.read_text())
        else:
            positions = evaluate_positions(result.model.to(resolve_device(config.device)), data, config)
            atomic_write(positions_path, lambda tmp, p=positions: Path(tmp).write_text(json.dumps(p)))
        runs.append(_run_entry(name, arm, seq_len, seed, config, result.log, positions, data.bytes_per_token))
    return summarize(study, runs)


def _run_entry(name, arm, seq_len, seed, config, log, positions, bytes_per_token) -> dict:
    rates = [e["recent_tokens_per_s"] for e in log["train"][1:]] or [e["recent_tokens_per_s"] for e in log["train"]]
    scale = 1 / math.log(2) / (bytes_per_token or 1)
    return {"name": name, "arm": arm, "seq_len": seq_len, "seed": seed, "params": log["params"],
            "steps": config.steps, "batch_size": config.batch_size, "device": log.get("device"),
            "compiled": log.get("compiled"),
            "val": [{"tokens": v.get("tokens"), "time_s": v.get("time_s"), "bpb": v.get("val_bpb"),
                     "loss": v["val_loss"]} for v in log["val"]],
            "tokens_per_s": statistics.median(rates) if rates else None,
            "position_bpb": [x * scale for x in positions]}


def _spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (max(values) - min(values)) / 2


def _time_to(curve, target):
    """Run time at which a validation curve first reaches ``target`` bits/byte (linear between points)."""
    for a, b in zip(curve, curve[1:]):
        if b["bpb"] is not None and b["bpb"] <= target:
            if a["bpb"] is None or a["bpb"] <= target or b["time_s"] is None or a["time_s"] is None:
                return b["time_s"]
            return a["time_s"] + (a["bpb"] - target) / (a["bpb"] - b["bpb"]) * (b["time_s"] - a["time_s"])
    return None


def position_bins(seq_len: int) -> list[tuple[int, int]]:
    edges = sorted({min(e, seq_len) for e in POSITION_EDGES} | {seq_len})
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def summarize(study: Study, runs: list[dict]) -> dict:
    """The record: every run, and per (arm, length) the mean and half-range over seeds of the final
    bits/byte, tokens/s, run time to the RG-LRU model's final bits/byte, and bits/byte by position."""
    groups = {}
    for r in runs:
        groups.setdefault((r["arm"], r["seq_len"]), []).append(r)
    target = None
    if ("rglru", study.seq_len) in groups:
        target, _ = _spread([g["val"][-1]["bpb"] for g in groups[("rglru", study.seq_len)]])
    table = []
    for (arm, seq_len), rs in groups.items():
        bpb, bpb_spread = _spread([r["val"][-1]["bpb"] for r in rs])
        rate, rate_spread = _spread([r["tokens_per_s"] for r in rs])
        times = [_time_to(r["val"], target) if target is not None and seq_len == study.seq_len else None for r in rs]
        reached = all(t is not None for t in times) and target is not None and seq_len == study.seq_len
        bins = []
        for a, b in position_bins(seq_len):
            mean, half = _spread([statistics.fmean(r["position_bpb"][a:b]) for r in rs])
            bins.append({"from": a, "to": b, "bpb": mean, "spread": half})
        table.append({"arm": arm, "seq_len": seq_len, "seeds": [r["seed"] for r in rs], "params": rs[0]["params"],
                      "bpb": bpb, "bpb_spread": bpb_spread, "tokens_per_s": rate, "tokens_per_s_spread": rate_spread,
                      "time_to_rglru_s": statistics.fmean(times) if reached else None,
                      "time_to_rglru_spread_s": _spread(times)[1] if reached else None, "position_bins": bins})
    return {"schema": SCHEMA, "study": study.to_dict(), "rglru_final_bpb": target, "table": table, "runs": runs}


def write_record(record: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))
    return path


def _fmt(value, spread=None, digits=3):
    if value is None:
        return "—"
    text = f"{value:.{digits}f}"
    return text if spread is None else f"{text} ± {spread:.{digits}f}"


def markdown(record: dict) -> str:
    """The record's tables: final bits/byte, tokens/s and time to the RG-LRU model's final bits/byte, and
    bits/byte by position in the context."""
    rows = ["| model | L | seeds | params | bits/byte (mean ± half-range) | training tokens/s | "
            "run time to RG-LRU's final bits/byte |", "|---|---|---|---|---|---|---|"]
    for t in record["table"]:
        rate = "—" if t["tokens_per_s"] is None else f"{t['tokens_per_s'] / 1e3:,.1f}K"
        time = "—" if t["time_to_rglru_s"] is None else f"{t['time_to_rglru_s']:.0f} s"
        rows.append(f"| {t['arm']} | {t['seq_len']} | {len(t['seeds'])} | {t['params'] / 1e6:.1f}M | "
                    f"{_fmt(t['bpb'], t['bpb_spread'])} | {rate} | {time} |")
    out = "\n".join(rows)
    for seq_len in sorted({t["seq_len"] for t in record["table"]}):
        group = [t for t in record["table"] if t["seq_len"] == seq_len]
        bins = group[0]["position_bins"]
        head = "| model | " + " | ".join(f"positions {b['from']}–{b['to'] - 1}" for b in bins) + " |"
        lines = [head, "|---|" + "---|" * len(bins)]
        lines += [f"| {t['arm']} | " + " | ".join(_fmt(b["bpb"], b["spread"]) for b in t["position_bins"]) + " |"
                  for t in group]
        out += f"\n\nBits/byte by position in the context, L = {seq_len}:\n\n" + "\n".join(lines)
    return out


def plots(record: dict, folder, stem: str = "compare") -> list[Path]:
    """Validation bits/byte against tokens and against run time (each arm's seeds: mean line, min-max band),
    and bits/byte by position, as PNGs in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    study = record["study"]
    main = [r for r in record["runs"] if r["seq_len"] == study["seq_len"]]
    for axis, label in (("tokens", "tokens trained"), ("time_s", "run time (s)")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for arm in study["arms"]:
            rs = [r for r in main if r["arm"] == arm]
            if not rs:
                continue
            n = min(len(r["val"]) for r in rs)
            xs = [statistics.fmean(r["val"][i][axis] for r in rs) for i in range(1, n)]
            ys = [[r["val"][i]["bpb"] for r in rs] for i in range(1, n)]
            line, = ax.plot(xs, [statistics.fmean(y) for y in ys], label=f"{arm} ({len(rs)} seeds)")
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.2)
        ax.set_xlabel(label)
        ax.set_ylabel("validation bits/byte")
        ax.set_title(f"{study['preset']} preset, L = {study['seq_len']}")
        ax.legend()
        ax.grid(alpha=0.3)
        path = folder / f"{stem}_bpb_vs_{'tokens' if axis == 'tokens' else 'time'}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for t in record["table"]:
        centers = [(b["from"] + b["to"]) / 2 for b in t["position_bins"]]
        ax.plot(centers, [b["bpb"] for b in t["position_bins"]], marker="o", label=f"{t['arm']}, L = {t['seq_len']}")
    ax.set_xscale("log")
    ax.set_xlabel("position in the context (bin centre)")
    ax.set_ylabel("validation bits/byte")
    ax.set_title("bits/byte by position")
    ax.legend()
    ax.grid(alpha=0.3)
    path = folder / f"{stem}_bpb_by_position.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
