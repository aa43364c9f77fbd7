"""Training loop: learning, schedule, exact resume, refusal to overwrite, DDP on CPU (gloo, 2 processes)."""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from samu.data import TokenData, text_corpus
from samu.models import CheckpointError, LanguageModel, LMConfig, load_checkpoint
from samu.ops import dispatch
from samu.train import CosineSchedule, TrainConfig, check_out_dir, current_checkpoint, train
from tests.helpers import byte_text as _text
from tests.helpers import rel_err

MODEL = LMConfig(width=16, num_layers=2, lru_width=8)


def _config(tmp_path, name="run", **kw):
    base = dict(model=MODEL, out_dir=str(tmp_path / name), steps=6, batch_size=3, seq_len=24,
                warmup_steps=2, eval_every=3, eval_batches=2, checkpoint_every=3, log_every=1,
                lr=1e-2, min_lr=1e-3, progress=False)
    return TrainConfig(**{**base, **kw})


def test_training_lowers_validation_loss_and_writes_a_log(tmp_path):
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path, steps=30, eval_every=30, lr=2e-2)
    result = train(config, data=data)
    first, last = result.log["val"][0], result.log["val"][-1]
    assert first["step"] == 0 and last["step"] == 30
    assert last["val_loss"] < first["val_loss"] - 1.0
    assert last["val_bpb"] == pytest.approx(last["val_loss"] / math.log(2))
    log = json.loads((tmp_path / "run" / "log.json").read_text())
    assert log["done"] and len(log["train"]) == 30 and log["params"] == MODEL.num_params()
    assert log["config"]["model"] == MODEL.to_dict()
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["train"]["step"] == 30


def test_cosine_schedule():
    s = CosineSchedule(warmup=4, total=14, min_ratio=0.1)
    assert [s(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s(4) == 1.0 and s(9) == pytest.approx(0.55)
    assert s(14) == pytest.approx(0.1) and s(20) == pytest.approx(0.1)
    assert all(s(i) >= s(i + 1) for i in range(4, 20))


class _Interrupted(Exception):
    pass


class _StopAfter(TokenData):
    """Token data whose sampler raises after ``limit`` batches: an interrupted run."""

    def __init__(self, data, limit):
        super().__init__(**{f.name: getattr(data, f.name) for f in dataclasses.fields(TokenData)})
        object.__setattr__(self, "calls", [0, limit])

    def sample(self, *args):
        self.calls[0] += 1
        if self.calls[0] > self.calls[1]:
            raise _Interrupted
        return super().sample(*args)


def _untimed(entries):
    return [{k: v for k, v in e.items() if k not in ("time_s", "tokens_per_s", "recent_tokens_per_s", "mfu")} for e in entries]


def test_log_steps_read_a_step_later_log_what_reading_at_once_logs(tmp_path):
    """A log step's values reach the log when the next step is queued (no wait for the GPU); a step that validates
    or saves reads them at once. Either way the entries are the same, and the last step's is there."""
    data = text_corpus(_text(tmp_path))
    later = train(_config(tmp_path, "later", eval_every=100, checkpoint_every=100), data=data)
    at_once = train(_config(tmp_path, "at_once", eval_every=1), data=data)
    assert [e["step"] for e in later.log["train"]] == list(range(1, 7))
    assert _untimed(later.log["train"]) == _untimed(at_once.log["train"])
    assert json.loads((tmp_path / "later" / "log.json").read_text())["train"] == later.log["train"]


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_resume_continues_exactly(tmp_path, grad_accum):
    data = text_corpus(_text(tmp_path))
    whole = train(_config(tmp_path, "whole", grad_accum=grad_accum), data=data)
    with pytest.raises(_Interrupted):
        train(_config(tmp_path, "parts", grad_accum=grad_accum), data=_StopAfter(data, 4 * grad_accum))
    assert load_checkpoint(tmp_path / "parts" / "checkpoint.pt")["train"]["step"] == 3
    resumed = train(_config(tmp_path, "parts", grad_accum=grad_accum), data=data, resume=True)
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert _untimed(resumed.log["train"]) == _untimed(whole.log["train"])
    assert [v["val_loss"] for v in resumed.log["val"]] == [v["val_loss"] for v in whole.log["val"]]
    assert resumed.log["resumed_at"] == [3] and "config_changes" not in resumed.log
    # the log names the code that ran it, and again the code of each resumption
    assert resumed.log["env"]["git_commit"] and len(resumed.log["resumed_env"]) == 1
    assert resumed.log["resumed_env"][0]["git_commit"] == resumed.log["env"]["git_commit"]


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_clipped_steps_on_the_adamw_kernels_train_alike_and_resume_exactly(tmp_path, monkeypatch):
    """samu.ops.adamw's step (what a run takes on CUDA; forced here, in the interpreter on CPU) trains as torch's
    AdamW does, within 1e-4 after six steps with both in fp32 (under bf16 autocast on a GPU a
    last-bit difference in a weight can flip its bf16 rounding, and Adam's normalised step makes that lr-sized),
    says so in the log, and resumes to the bit (under bf16 autocast, as on CUDA). Under bf16 autocast the linear
    layers take the bf16 copies of their weights that the step writes (train._LowWeights): the same bits as casting
    the weights in every forward, and the layers hold no copy after the run."""
    import samu.train as training

    data = text_corpus(_text(tmp_path))
    monkeypatch.setattr(training, "_adamw_kernels", lambda device: False)
    plain = train(_config(tmp_path, "torch", autocast="none"), data=data)
    assert not plain.log["optimizer_kernels"]
    monkeypatch.setattr(training, "_adamw_kernels", lambda device: True)
    fp32 = train(_config(tmp_path, "fp32", autocast="none"), data=data)
    assert fp32.log["optimizer_kernels"] and not fp32.log["bf16_weight_copies"]
    for (name, a), b in zip(fp32.model.named_parameters(), plain.model.parameters()):
        assert rel_err(a, b) < 1e-4, name
    whole = train(_config(tmp_path, "whole", autocast="bf16"), data=data)
    assert whole.log["optimizer_kernels"] and whole.log["bf16_weight_copies"]
    assert all(getattr(m, "low_weight", None) is None for m in whole.model.modules())
    with pytest.raises(_Interrupted):
        train(_config(tmp_path, "parts", autocast="bf16"), data=_StopAfter(data, 4))
    resumed = train(_config(tmp_path, "parts", autocast="bf16"), data=data, resume=True)
    lows = training._LowWeights
    monkeypatch.setattr(training, "_LowWeights",
                        lambda model, optimizer, autocasts, closing: lows(model, optimizer, False, closing))
    cast = train(_config(tmp_path, "cast", autocast="bf16"), data=data)
    assert not cast.log["bf16_weight_copies"]
    for other in (resumed, cast):
        for (name, a), (_, b) in zip(whole.model.state_dict().items(), other.model.state_dict().items()):
            assert torch.equal(a, b), name
        assert _untimed(other.log["train"]) == _untimed(whole.log["train"])


def test_the_bf16_weight_copies_are_never_older_than_their_weights():
    """train._LowWeights: a copy on every Linear weight the ClippedAdamW steps, equal to its cast; an in-place change
    of a weight outside the step is cast again by ``check``, one by the step (``stepped``) is not; a replaced weight is
    refused; the copies come off the layers and out of the optimizer when the run's ExitStack closes, on an exception
    as well."""
    import contextlib

    import samu.train as training
    from samu.modules.layers import Linear
    from samu.ops import adamw

    model = LanguageModel(MODEL)
    optimizer = adamw.ClippedAdamW(model.parameters(), max_norm=1.0)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    with pytest.raises(ZeroDivisionError), contextlib.ExitStack() as closing:
        lows = training._LowWeights(model, optimizer, True, closing)
        assert len(lows.rows) == len(linears) > 0
        for m in linears:
            assert torch.equal(m.low_weight, m.weight.detach().to(torch.bfloat16))
        w = linears[0].weight
        with torch.no_grad():
            w.add_(0.25)
        assert not torch.equal(linears[0].low_weight, w.detach().to(torch.bfloat16))
        lows.check()
        assert torch.equal(linears[0].low_weight, w.detach().to(torch.bfloat16))
        # after a step (which writes the copies of the weights with gradients itself) check casts nothing again
        with torch.no_grad():
            w.mul_(1.0)
            linears[2].weight.mul_(1.0)   # no gradient: the step leaves it, so check must look again
        w.grad = torch.zeros_like(w)
        lows.stepped()
        seen = linears[0].low_weight._version, linears[2].low_weight._version
        lows.check()
        assert linears[0].low_weight._version == seen[0] and linears[2].low_weight._version > seen[1]
        linears[1].weight = nn.Parameter(linears[1].weight.detach().clone())
        with pytest.raises(RuntimeError, match="replaced"):
            lows.check()
        1 / 0
    assert all(m.low_weight is None for m in linears) and not optimizer.low_copies
    with contextlib.ExitStack() as closing:
        assert not training._LowWeights(model, optimizer, False, closing).rows   # no bf16 autocast: none


def test_a_run_uses_deterministic_algorithms_and_restores_the_setting(tmp_path, monkeypatch):
    """On by default (a compiled run resumed on CUDA equals an uninterrupted one only with them,
    results/dev/issue10/resume_check_1.txt, _2.txt), warn-only unless the caller had them strict, without the NaN
    fill of every allocation and with PyTorch's warning about cuBLAS's workspace silenced; the caller's settings
    and warning filters are back after the run, a failed one too."""
    import samu.train as training

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    seen, run = [], training._run

    def state():
        return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.utils.deterministic.fill_uninitialized_memory)

    def spy(*args, **kwargs):
        seen.append((*state(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        warnings.warn("as PyTorch warns at a product: ... CUBLAS_WORKSPACE_CONFIG=:4096:8 ...", UserWarning)
        if len(seen) == 4:
            raise RuntimeError("a run that fails")
        return run(*args, **kwargs)

    monkeypatch.setattr(training, "_run", spy)
    data = text_corpus(_text(tmp_path))
    before = state()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        train(_config(tmp_path, "on", steps=1), data=data)
        assert not [w for w in shown if "CUBLAS" in str(w.message)]
        # the run's filter is gone, the caller's are all there (libraries imported on the way may add theirs)
        assert all(f in warnings.filters for f in filters)
        assert not [f for f in warnings.filters if f[1] is not None and "CUBLAS" in f[1].pattern]
        train(_config(tmp_path, "off", steps=1, deterministic=False), data=data)
        assert [w for w in shown if "CUBLAS" in str(w.message)]   # shown where the run is not deterministic
    # no cuBLAS workspace setting for a warn-only run (it costs host time at every product, and one stream
    # repeats its products without it)
    assert seen[0] == (True, True, False, None) and seen[1] == (*before, None)
    assert state() == before and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    # a caller's strict setting stays strict, and comes back after a run that raises
    torch.use_deterministic_algorithms(True)
    try:
        train(_config(tmp_path, "strict", steps=1), data=data)
        with pytest.raises(RuntimeError, match="a run that fails"):
            train(_config(tmp_path, "fails", steps=1), data=data)
        assert seen[2][:2] == (True, False) and state()[:2] == (True, False)
        # a strict caller gets the workspace PyTorch demands (where CUDA has not made its first handle yet)
        assert seen[2][3] == ":4096:8" or torch.cuda.is_initialized()
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    with pytest.raises(ValueError, match="deterministic must be true or false"):
        _config(tmp_path, deterministic="yes")


def test_refuses_to_overwrite_or_resume_a_different_run(tmp_path):
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path, steps=3)
    train(config, data=data)
    ckpt = tmp_path / "run" / "checkpoint.pt"
    before = ckpt.read_bytes()
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(config, data=data)
    with pytest.raises(CheckpointError, match=r"lr \(0.01 there, 0.02 here\)"):
        train(dataclasses.replace(config, lr=2e-2), data=data, resume=True)
    with pytest.raises(CheckpointError, match="holds a model"):
        train(dataclasses.replace(config, model=dataclasses.replace(MODEL, width=20)), data=data, resume=True)
    for changed in (dict(autocast="bf16"), dict(backend="reference"), dict(deterministic=False)):
        # settings that change the arithmetic would not continue the run exactly
        name = next(iter(changed))
        with pytest.raises(CheckpointError, match=f"cannot resume .*{name} "):
            train(dataclasses.replace(config, steps=6, **changed), data=data, resume=True)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        train(_config(tmp_path, "fresh"), data=data, resume=True)
    assert ckpt.read_bytes() == before


def test_a_resume_that_changes_a_cadence_logs_the_change(tmp_path):
    data = text_corpus(_text(tmp_path))
    with pytest.raises(_Interrupted):
        train(_config(tmp_path), data=_StopAfter(data, 4))
    resumed = train(_config(tmp_path, eval_every=2, keep=3), data=data, resume=True)
    assert resumed.log["config_changes"] == [{"step": 3, "changed": {"eval_every": [3, 2], "keep": [2, 3]}}]
    assert resumed.log["config"]["eval_every"] == 2 and resumed.log["config"]["keep"] == 3


def test_a_finished_run_is_not_touched_on_resume(tmp_path):
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path, steps=3)
    first = train(config, data=data)
    run = tmp_path / "run"
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()}
    again = train(config, data=data, resume=True)
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in run.iterdir()} == before
    assert "resumed_at" not in again.log and again.log["done"]
    assert again.log["val"] == first.log["val"]
    for (name, a), (_, b) in zip(first.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_files_get_the_umask_mode(tmp_path):
    umask = os.umask(0o027)
    try:
        train(_config(tmp_path, steps=1), data=text_corpus(_text(tmp_path)))
    finally:
        os.umask(umask)
    for name in ("checkpoint.pt", "log.json"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o640, name


def test_threads_are_set_for_the_run_only(tmp_path):
    threads = torch.get_num_threads()
    other = 1 if threads > 1 else 2
    result = train(_config(tmp_path, steps=1, threads=other, device="cpu"), data=text_corpus(_text(tmp_path)))
    assert result.log["cpu_threads"] == other and torch.get_num_threads() == threads


def test_a_bad_out_dir_is_refused_before_any_work(tmp_path, monkeypatch):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    loaded = []
    monkeypatch.setattr("samu.train.load_data", lambda *a: loaded.append(a))
    for out, message in [(a_file, "exists and is not a folder"), (a_file / "run", "cannot be created"),
                         ("/proc/forbidden", "is not writable")]:
        with pytest.raises(ValueError, match=f"out_dir '{out}' {message}"):
            train(_config(tmp_path, out_dir=str(out)))
    assert loaded == [] and [p.name for p in tmp_path.iterdir()] == ["a_file"]
    assert check_out_dir(tmp_path / "new" / "run") == tmp_path / "new" / "run"
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def test_data_that_does_not_fit_is_rejected(tmp_path):
    data = text_corpus(_text(tmp_path))
    with pytest.raises(ValueError, match="the val split has"):
        train(_config(tmp_path, seq_len=500), data=data)
    with pytest.raises(ValueError, match="vocab_size is 100"):
        train(_config(tmp_path, model=dataclasses.replace(MODEL, vocab_size=100)), data=data)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kw,match", [
    (dict(steps=0), "steps must be a positive integer"),
    (dict(batch_size=1.5), "batch_size must be a positive integer"),
    (dict(lr=float("nan")), "lr must be a finite number"),
    (dict(min_lr=1.0), "need 0 <= min_lr <= lr"),
    (dict(betas=(0.9, 1.0)), "betas"),
    (dict(autocast="fp8"), "autocast must be one of"),
    (dict(data_format="csv"), "data_format must be one of"),
    (dict(warmup_steps=-1), "warmup_steps must be a non-negative integer"),
    (dict(threads=0), "threads must be a positive integer"),
    (dict(lr=float("inf")), "lr must be a finite number >= 0, got inf"),
    (dict(device="foo"), "device must be auto, cpu, cuda or cuda:N, got 'foo'"),
])
def test_config_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kw)


# `python -m samu.cli`, then exit 3 should a gloo thread still run after up to 10 s (one being joined may be listed
# a moment longer; CI once saw `gloo_tcp_loop` right after the run): destroy_process_group() must have
# joined them. Left running into interpreter shutdown, a worker that releases a finished all_reduce's
# tensor there takes the GIL and is ended mid-destructor: "terminate called without an active exception",
# a rare abort (CI saw it once) whose precondition this checks every run. FSDP2 (torch 2.13) keeps the
# group alive past destroy_process_group() (its device meshes stay referenced from DTensor's internals), so
# its threads run on whatever samu does: with SAMU_TEST_FSDP=1 the script leaves by os._exit, without the
# interpreter shutdown where that abort happens. With SAMU_TEST_STOP_AFTER=n, rank 0 sends itself SIGINT as
# it draws its n-th micro-batch, as Ctrl-C would: the run stops (every rank) after that step, saves a
# checkpoint and exits with 130.
_CLI_THEN_NO_GLOO_THREADS = """
import gc, os, runpy, signal, sys, time
stop = int(os.environ.get("SAMU_TEST_STOP_AFTER", "0"))
if stop and os.environ.get("RANK", "0") == "0":
    from samu.data import TokenData
    sample, calls = TokenData.sample, [0]
    def stopping(self, *args):
        calls[0] += 1
        if calls[0] == stop:
            os.kill(os.getpid(), signal.SIGINT)
        return sample(self, *args)
    TokenData.sample = stopping
try:
    runpy.run_module("samu.cli", run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as e:
    code = e.code
def gloo_threads():
    names = []
    if os.path.isdir("/proc/self/task"):
        for task in os.listdir("/proc/self/task"):
            try:
                names.append(open(f"/proc/self/task/{task}/comm").read().strip())
            except OSError:
                pass
    return [name for name in names if "gloo" in name]
if os.environ.get("SAMU_TEST_FSDP") == "1":
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
# a worker being joined may still be listed for a moment: up to 10 s for it to go, never past shutdown
deadline = time.monotonic() + 10
gloo = gloo_threads()
while gloo and time.monotonic() < deadline:
    gc.collect()
    time.sleep(0.1)
    gloo = gloo_threads()
if gloo:
    print(f"rank {os.environ.get('RANK', 0)}: gloo threads still running after the run: {gloo}", file=sys.stderr)
sys.exit(code or (3 if gloo else 0))
"""


def _launch(tmp_path, args, processes=None, stop_after=0, fsdp=False):
    """samu's CLI with ``args`` in ``processes`` gloo processes under torchrun (None: one plain process), through
    the script above; returns the finished subprocess."""
    script = tmp_path / "samu_cli_then_no_gloo_threads.py"
    script.write_text(_CLI_THEN_NO_GLOO_THREADS)
    # faulthandler: should a rank ever abort, its stderr shows every thread's Python stack
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", "TORCH_SHOW_CPP_STACKTRACES": "1",
           "SAMU_TEST_STOP_AFTER": str(stop_after), "SAMU_TEST_FSDP": str(int(fsdp))}
    runner = [] if processes is None else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                           str(processes)]
    return subprocess.run([sys.executable, *runner, str(script), *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _weights_close(folder, reference):
    model = load_checkpoint(current_checkpoint(folder))["model"]
    for name, a in reference.items():
        assert torch.allclose(model[name], a, rtol=1e-4, atol=1e-6), (folder.name, name)


def test_ddp_two_processes_equal_one_process_with_accumulation(tmp_path):
    corpus = _text(tmp_path)
    common = ["train", "--data", str(corpus), "--width", "16", "--layers", "2", "--lru-width", "8",
              "--steps", "3", "--batch-size", "2", "--seq-len", "24", "--eval-batches", "2",
              "--warmup", "1", "--device", "cpu", "--no-progress"]
    run = _launch(tmp_path, [*common, "--out", str(tmp_path / "ddp")], processes=2)
    # On failure show the start of stderr (where a rank's own error lands) and the end of stdout.
    assert run.returncode == 0, f"stderr:\n{run.stderr[:3000]}\nstdout:\n{run.stdout[-2000:]}"
    from samu.cli import main

    assert main([*common, "--grad-accum", "2", "--out", str(tmp_path / "single")]) == 0
    # two processes write a sharded checkpoint (torch.distributed.checkpoint) that one process reads whole
    assert (tmp_path / "ddp" / "checkpoint").is_symlink() and not (tmp_path / "ddp" / "checkpoint.pt").exists()
    ddp = load_checkpoint(current_checkpoint(tmp_path / "ddp"))
    single = load_checkpoint(tmp_path / "single" / "checkpoint.pt")
    _weights_close(tmp_path / "ddp", single["model"])
    ddp_log = json.loads((tmp_path / "ddp" / "log.json").read_text())
    assert ddp_log["world_size"] == 2
    assert ddp_log["val"][-1]["val_loss"] == pytest.approx(json.loads(ddp["train"]["log"])["val"][-1]["val_loss"])
    single_log = json.loads(single["train"]["log"])
    assert ddp_log["val"][-1]["val_loss"] == pytest.approx(single_log["val"][-1]["val_loss"], rel=1e-4)
    # the logged training loss is the mean over the ranks, as one process's over its micro-steps
    assert [e["loss"] for e in ddp_log["train"]] == pytest.approx([e["loss"] for e in single_log["train"]], rel=1e-4)


def test_the_current_checkpoint_is_the_later_kind_or_the_latest_folder(tmp_path):
    from samu.models.checkpoint import point_link, save_sharded

    data = text_corpus(_text(tmp_path))
    result = train(_config(tmp_path, keep=1), data=data)
    out = tmp_path / "run"
    optimizer = torch.optim.AdamW(result.model.parameters())
    state = load_checkpoint(out / "checkpoint.pt")["train"]

    def sharded(step):
        save_sharded(out / f"checkpoint-{step}", result.model, optimizer, {**state, "step": step}, is_main=True)

    # one process wrote checkpoint.pt at step 6; a group wrote (a run that switched kinds and stopped between
    # writing the one and removing the other) a sharded one before it, then one after it
    sharded(4)
    point_link(out / "checkpoint", "checkpoint-4")
    assert current_checkpoint(out) == out / "checkpoint.pt"
    sharded(9)
    point_link(out / "checkpoint", "checkpoint-9")
    assert current_checkpoint(out) == out / "checkpoint"
    assert load_checkpoint(current_checkpoint(out), weights=False)["train"]["step"] == 9
    # a copy that dropped the link and the file: the latest folder
    (out / "checkpoint").unlink()
    (out / "checkpoint.pt").unlink()
    assert current_checkpoint(out) == out / "checkpoint-9"
    # ... which a fresh run into the folder does not overwrite
    with pytest.raises(FileExistsError, match="already holds a run"):
        train(_config(tmp_path, keep=1), data=data)


def test_fsdp_equals_one_process_and_resumes_on_another_number_of_processes(tmp_path, capsys):
    corpus = _text(tmp_path)
    # 10 validation windows: 4 processes hold 3, 3, 2 and 2, so the last two make one forward call fewer of
    # their own and one more in lockstep (a sharded model gathers its parameters in every call, on every rank)
    common = ["train", "--data", str(corpus), "--width", "16", "--layers", "2", "--lru-width", "8",
              "--steps", "4", "--batch-size", "2", "--seq-len", "24", "--eval-batches", "5", "--eval-every", "2",
              "--checkpoint-every", "2", "--warmup", "1", "--device", "cpu", "--no-progress"]
    from samu.cli import main

    # the reference: one process, 4 micro-batches a step
    assert main([*common, "--grad-accum", "4", "--out", str(tmp_path / "one")]) == 0
    reference = load_checkpoint(tmp_path / "one" / "checkpoint.pt")["model"]
    one_log = json.loads((tmp_path / "one" / "log.json").read_text())

    # 2 processes sharding the model (x 2 micro-batches), stopped after step 2 (rank 0's 4th micro-batch)
    fsdp = tmp_path / "fsdp"
    two = ["--data-parallel", "fsdp", "--grad-accum", "2"]
    run = _launch(tmp_path, [*common, *two, "--out", str(fsdp)], processes=2, stop_after=4, fsdp=True)
    assert run.returncode != 0 and "--resume" in run.stdout + run.stderr, run.stderr[:3000]
    assert os.readlink(fsdp / "checkpoint") == "checkpoint-2"
    # sharded: each of the 2 ranks saved half of every parameter's rows (DDP would save each whole, once)
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(fsdp / "checkpoint-2").read_metadata().state_dict_metadata
    weight = saved["model.layers.0.block.linear_in.weight"]
    assert [(c.offsets[0], c.sizes[0]) for c in weight.chunks] == [(0, weight.size[0] // 2),
                                                                   (weight.size[0] // 2, weight.size[0] // 2)]
    assert load_checkpoint(fsdp / "checkpoint", weights=False)["train"]["step"] == 2
    # a micro-batch count that does not fit is refused, naming what would
    with pytest.raises(CheckpointError, match="with 1 process use grad_accum=4"):
        train(dataclasses.replace(TrainConfig.from_dict(json.loads(
            load_checkpoint(fsdp / "checkpoint", weights=False)["train"]["config"])), data_parallel="ddp"),
            resume=True)
    assert main([*common, "--grad-accum", "1", "--resume", "--out", str(fsdp)]) == 1
    assert "with 1 process use --grad-accum=4" in capsys.readouterr().err
    copy = tmp_path / "fsdp-copy"
    shutil.copytree(fsdp, copy, symlinks=True)
    # ... resumed on 4 processes sharding it (x 1 micro-batch: torch.distributed.checkpoint reshards), and a
    # copy resumed on one process without sharding: both end where the single process did
    run = _launch(tmp_path, [*common, "--data-parallel", "fsdp", "--grad-accum", "1", "--resume", "--out",
                             str(fsdp)], processes=4, fsdp=True)
    assert run.returncode == 0, f"stderr:\n{run.stderr[:3000]}\nstdout:\n{run.stdout[-2000:]}"
    assert main([*common, "--data-parallel", "ddp", "--grad-accum", "4", "--resume", "--out", str(copy)]) == 0
    for folder in (fsdp, copy):
        _weights_close(folder, reference)
        log = json.loads((folder / "log.json").read_text())
        assert log["resumed_at"] == [2]
        assert [e["loss"] for e in log["train"]] == pytest.approx([e["loss"] for e in one_log["train"]], rel=1e-4)
        assert [v["val_loss"] for v in log["val"]] == pytest.approx([v["val_loss"] for v in one_log["val"]], rel=1e-4)
    # the 4-process run wrote sharded checkpoints on; the one-process copy a file, keeping the folder before it
    assert os.readlink(fsdp / "checkpoint") == "checkpoint-4" and (fsdp / "checkpoint-2").is_dir()
    assert (copy / "checkpoint.pt").is_file() and not (copy / "checkpoint").exists()
    assert (copy / "checkpoint-2").is_dir()

    # one process's checkpoint (a file) resumed by 2 processes sharding it
    single = tmp_path / "single"
    run = _launch(tmp_path, [*common, "--grad-accum", "4", "--out", str(single)], stop_after=8)
    assert run.returncode == 130, run.stderr[:3000]
    assert load_checkpoint(single / "checkpoint.pt")["train"]["step"] == 2
    run = _launch(tmp_path, [*common, *two, "--resume", "--out", str(single)], processes=2, fsdp=True)
    assert run.returncode == 0, f"stderr:\n{run.stderr[:3000]}\nstdout:\n{run.stdout[-2000:]}"
    _weights_close(single, reference)
    assert (single / "checkpoint-2.pt").is_file() and not (single / "checkpoint.pt").exists()

    # DDP's checkpoint (sharded too: each tensor saved once) stopped at step 2 on 4 processes, resumed by one
    ddp = tmp_path / "ddp"
    run = _launch(tmp_path, [*common, "--grad-accum", "1", "--out", str(ddp)], processes=4, stop_after=2)
    assert run.returncode != 0 and os.readlink(ddp / "checkpoint") == "checkpoint-2", run.stderr[:3000]
    assert main([*common, "--grad-accum", "4", "--resume", "--out", str(ddp)]) == 0
    _weights_close(ddp, reference)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_autocast_training_on_gpu(tmp_path):
    from samu.ops import dispatch

    data = text_corpus(_text(tmp_path))
    # a named Triton variant: the tests run with gating off, where `auto` would take the PyTorch mixer here
    variant = sorted(dispatch.variants("samu"))[0]
    result = train(_config(tmp_path, steps=30, eval_every=30, lr=2e-2, device="cuda", backend=variant), data=data)
    assert result.log["device"].startswith("cuda")
    assert result.log["val"][-1]["val_loss"] < result.log["val"][0]["val_loss"] - 1.0
    assert all(p.is_cuda and p.dtype == torch.float32 for p in result.model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_ddp_two_gpus_equal_one_gpu_with_accumulation(tmp_path):
    corpus = _text(tmp_path)
    common = ["train", "--data", str(corpus), "--width", "64", "--layers", "2", "--num-heads", "4",
              "--steps", "3", "--batch-size", "2", "--seq-len", "64", "--eval-batches", "2", "--warmup", "1",
              "--autocast", "none", "--no-progress"]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "samu.cli", *common, "--out", str(tmp_path / "ddp")],
                         capture_output=True, text=True, timeout=600)
    # On failure show the start of stderr (where a rank's own error lands) and the end of stdout.
    assert run.returncode == 0, f"stderr:\n{run.stderr[:3000]}\nstdout:\n{run.stdout[-2000:]}"
    from samu.cli import main

    assert main([*common, "--grad-accum", "2", "--out", str(tmp_path / "single")]) == 0
    ddp = load_checkpoint(current_checkpoint(tmp_path / "ddp"))["model"]
    single = load_checkpoint(tmp_path / "single" / "checkpoint.pt")["model"]
    for name, a in single.items():
        assert torch.allclose(ddp[name], a, rtol=1e-3, atol=1e-5), name


def test_activation_checkpointing_trains_to_the_same_weights_and_logs_speed(tmp_path, monkeypatch):
    from samu.modules import ResidualLayer

    calls = []
    forward = ResidualLayer.forward
    monkeypatch.setattr(ResidualLayer, "forward", lambda self, *a, **kw: calls.append(1) or forward(self, *a, **kw))
    data = text_corpus(_text(tmp_path))
    plain = train(_config(tmp_path, "plain"), data=data)
    n_plain = len(calls)
    recomputed = train(_config(tmp_path, "recomputed", activation_checkpointing=True), data=data)
    # every layer's forward runs again in the backward of each training step (6 steps x 2 layers)
    assert len(calls) - n_plain == n_plain + 6 * MODEL.num_layers
    assert recomputed.log["activation_checkpointing"] and not plain.log["activation_checkpointing"]
    for (name, a), b in zip(plain.model.state_dict().items(), recomputed.model.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name
    entry = plain.log["train"][-1]
    assert entry["recent_tokens_per_s"] > 0 and entry["tokens_per_s"] > 0
    assert entry["mfu"] is None and plain.log["compiled"] is False   # CPU: no peak to compare with, no compile


def test_training_turns_the_per_call_finiteness_check_off_and_restores_it(tmp_path):
    from samu.ops.checks import check_finite_enabled

    seen = []
    data = text_corpus(_text(tmp_path))
    original = LanguageModel.forward

    def spy(self, *a, **kw):
        seen.append(check_finite_enabled())
        return original(self, *a, **kw)

    before = check_finite_enabled()
    LanguageModel.forward = spy
    try:
        train(_config(tmp_path, steps=2), data=data)
    finally:
        LanguageModel.forward = original
    assert seen and not any(seen)
    assert check_finite_enabled() == before


def test_compile_on_trains_through_torch_compile(tmp_path, monkeypatch):
    from samu.modules import SAMUMixer

    compiled, events = [], []

    def fake_compile(module, **kw):
        compiled.append(module)
        events.append("compile")
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    choose = SAMUMixer.choose
    monkeypatch.setattr(SAMUMixer, "choose", lambda self, *a, **kw: events.append(a[:2]) or choose(self, *a, **kw))
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path, "on", steps=2, compile="on")
    result = train(config, data=data)
    assert result.log["compiled"] and compiled == [result.model]
    # every mixer's implementation chosen (gated where no record covers it) before the trace, at the training shape
    shape = (config.batch_size, config.seq_len)
    assert events == [shape] * result.model.config.num_layers + ["compile"]
    # auto: CUDA only (on the CPU, which a GPU machine has too)
    result = train(_config(tmp_path, "auto", steps=2, device="cpu"), data=data)
    assert not result.log["compiled"] and len(compiled) == 1


def test_resuming_a_run_from_before_the_merged_projections_is_refused(tmp_path):
    data = text_corpus(_text(tmp_path))
    with pytest.raises(_Interrupted):
        train(_config(tmp_path), data=_StopAfter(data, 4))
    path = tmp_path / "run" / "checkpoint.pt"
    payload = torch.load(path, weights_only=False)
    for key in [k for k in payload["model"] if k.endswith("linear_in.weight") or k.endswith("linear_in.bias")]:
        w = payload["model"].pop(key)
        E = w.shape[0] // 2
        payload["model"][key.replace("linear_in", "linear_x")] = w[:E]
        payload["model"][key.replace("linear_in", "linear_y")] = w[E:]
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="before the block's W_x and W_y became one GEMM"):
        train(_config(tmp_path), data=data, resume=True)


def test_compile_and_checkpointing_flags():
    with pytest.raises(ValueError, match="compile must be one of"):
        TrainConfig(compile="yes")
    with pytest.raises(ValueError, match="activation_checkpointing must be true or false"):
        TrainConfig(activation_checkpointing="yes")


def _documents(tmp_path, count=40):
    """A folder of ``count`` text files (documents) of 3 to ~200 bytes, some shorter than a window."""
    folder = tmp_path / "docs"
    folder.mkdir()
    text = _text(tmp_path / "text").read_bytes()
    rng = np.random.default_rng(0)
    at = 0
    for i in range(count):
        n = int(rng.integers(3, 200))
        (folder / f"{i:03d}.txt").write_bytes(text[at:at + n])
        at += n
    return text_corpus(folder)


def test_packed_training_keeps_every_document_apart(tmp_path, monkeypatch):
    from samu import train as train_module

    data = _documents(tmp_path)
    seen = []
    original = LanguageModel.forward

    def spy(self, tokens, *a, cu_seqlens=None, **kw):
        if self.training:
            seen.append((tokens.clone(), cu_seqlens))
        return original(self, tokens, *a, cu_seqlens=cu_seqlens, **kw)

    monkeypatch.setattr(LanguageModel, "forward", spy)
    config = _config(tmp_path, "packed", steps=8, pack=True)
    result = train(config, data=data)
    assert result.log["packed"] and result.log["config"]["pack"] and not result.log["compiled"]
    assert result.log["val"][-1]["val_loss"] < result.log["val"][0]["val_loss"]
    assert len(seen) == 8
    starts = set(data.train_docs.tolist())
    train_text = bytes(data.train)
    for tokens, cu in seen:
        # one packed row of the batch's windows: every window and every document opens a sequence
        assert tokens.shape == (1, config.batch_size * config.seq_len)
        assert isinstance(cu, list)   # ints: the eager model reads them without a synchronisation
        windows = set(range(0, tokens.shape[1] + 1, config.seq_len))
        assert windows <= set(cu)
        row = bytes(tokens[0].tolist())
        for w in range(config.batch_size):
            window = row[w * config.seq_len:(w + 1) * config.seq_len]
            start = train_text.find(window)   # the windows are unique in this text
            inside = {w * config.seq_len + d - start for d in starts if start < d < start + config.seq_len}
            assert inside == {c for c in cu if w * config.seq_len < c < (w + 1) * config.seq_len}
    # the packed forward is the model run document by document
    model = result.model
    x, _, cu = data.sample(3, 80, np.random.default_rng(5), pack=True)
    packed = train_module.forward(model, x, cu).flatten(0, 1)
    cu = cu.tolist()
    alone = torch.cat([model(x.reshape(1, -1)[:, a:b])[0][0] for a, b in zip(cu, cu[1:])])
    assert torch.allclose(packed, alone, atol=1e-6)
    assert len(cu) > 4   # documents begin inside these windows: there the state was reset
    assert not torch.equal(packed, model(x)[0].flatten(0, 1))


def test_packed_runs_resume_exactly_and_refuse_the_other_way(tmp_path):
    data = _documents(tmp_path)
    whole = train(_config(tmp_path, "whole", pack=True), data=data)
    with pytest.raises(_Interrupted):
        train(_config(tmp_path, "cut", pack=True), data=_StopAfter(data, 4))
    resumed = train(_config(tmp_path, "cut", pack=True), data=data, resume=True)
    assert _untimed(resumed.log["train"]) == _untimed(whole.log["train"])
    with pytest.raises(CheckpointError, match=r"pack \(True there, False here\)"):
        train(_config(tmp_path, "whole", steps=6), data=data, resume=True)
    # the same bytes cut into other documents are other data: packing resets at the boundaries
    moved = dataclasses.replace(data, train_docs=np.unique(np.append(data.train_docs, data.train_docs[1] + 1)))
    assert moved.identity()["train"]["blake2b"] == data.identity()["train"]["blake2b"]
    with pytest.raises(_Interrupted):
        train(_config(tmp_path, "cut again", pack=True), data=_StopAfter(data, 4))
    with pytest.raises(CheckpointError, match="train split differs in its document boundaries"):
        train(_config(tmp_path, "cut again", pack=True), data=moved, resume=True)
    # a checkpoint written before the boundaries were part of the identity is checked on its tokens alone
    from samu.train import check_same_data

    old = {k: v if k == "name" else {"tokens": v["tokens"], "blake2b": v["blake2b"]}
           for k, v in data.identity().items()}
    check_same_data(old, moved.identity(), tmp_path / "old.pt")


def test_packing_needs_documents(tmp_path):
    with pytest.raises(ValueError, match="pack must be true or false"):
        TrainConfig(pack="yes")
    with pytest.raises(ValueError, match="pack: the data .* have no document boundaries"):
        train(_config(tmp_path, pack=True), data=text_corpus(_text(tmp_path)))
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


@pytest.mark.skipif(not dispatch.triton_available(), reason="triton is not installed")
def test_packed_training_compiles_only_through_a_packing_kernel(tmp_path, monkeypatch):
    """compile='on' with packed batches: refused in one line where a mixer would run one call per sequence
    (the torch backend); through a packing Triton variant (the interpreter here: a one-layer model, one
    step) the compiled model gets the checked offsets as an int32 tensor on its device."""
    data = _documents(tmp_path)
    with pytest.raises(ValueError, match="compile: packed batches compile only where a Triton variant packs"):
        train(_config(tmp_path, "torch", pack=True, compile="on"), data=data)
    seen = []
    original = LanguageModel.forward

    def spy(self, tokens, *a, cu_seqlens=None, **kw):
        if self.training:
            seen.append(cu_seqlens)
        return original(self, tokens, *a, cu_seqlens=cu_seqlens, **kw)

    monkeypatch.setattr(LanguageModel, "forward", spy)
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)   # the trace itself: test_compile.py
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    small = dict(model=LMConfig(width=8, num_layers=1, lru_width=8), steps=1, batch_size=2, seq_len=16,
                 eval_batches=1)
    compiled = train(_config(tmp_path, "compiled", pack=True, compile="on", backend="triton_grouped", **small),
                     data=data)
    assert compiled.log["compiled"] and len(seen) == 1
    assert isinstance(seen[0], torch.Tensor) and seen[0].dtype == torch.int32 and seen[0][-1] == 32


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("scale", [30.0, 1e-3])   # clipped, and below the limit
def test_clipped_step_steps_as_clip_grad_norm_does(fused, scale):
    """The fused AdamW scales the gradients itself (grad_scale) instead of a pass of their own: the same
    norm and, up to the rounding of one division against one product, the same moments and parameters; and
    the scale is gone after the step (a later step would scale again)."""
    from samu.train import clipped_step

    torch.manual_seed(0)
    models = [nn.Linear(20, 30), nn.Linear(20, 30)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randn(8, 20)
    opts = []
    for m in models:
        (m(x) * scale).sum().backward()
        opts.append(torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused))
    want = nn.utils.clip_grad_norm_(models[0].parameters(), 1.0)
    opts[0].step()
    got = clipped_step(models[1], opts[1], 1.0)
    assert torch.equal(want, got)
    assert getattr(opts[1], "grad_scale", None) is None
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert rel_err(a, b) < 1e-6
        for key in ("exp_avg", "exp_avg_sq"):
            assert rel_err(opts[0].state[a][key], opts[1].state[b][key]) < 1e-6, key


def test_position_losses_are_the_validation_windows_loss_at_each_position(tmp_path):
    from samu.train import evaluate, evaluate_positions

    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path)
    torch.manual_seed(0)
    model = LanguageModel(MODEL)
    got = evaluate_positions(model, data, config)
    starts = data.val_starts(config.seq_len, config.eval_batches * config.batch_size)
    x, y = data.windows("val", starts, config.seq_len)
    with torch.no_grad():
        logits = model(x)[0]
    want = F.cross_entropy(logits.double().transpose(1, 2), y, reduction="none").mean(0)
    assert len(got) == config.seq_len and len(starts) == config.eval_batches * config.batch_size
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, rtol=1e-6, atol=0)
    # late positions differ from early ones (an order reversal would show)
    assert abs(got[0] - got[-1]) > 1e-3
    assert sum(got) / len(got) == pytest.approx(evaluate(model, data, config, "cpu")["val_loss"], rel=1e-9)
