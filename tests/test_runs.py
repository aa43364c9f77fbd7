"""Training runs never lose or corrupt work: data identity, divergence, the folder lock, signals,
kept checkpoints, leftover files, write errors, implausible token files, clear messages."""

import dataclasses
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import samu
from samu.data import TokenData, text_corpus, token_file
from samu.errors import RunFolderBusy, TrainingDiverged, TrainingInterrupted
from samu.models import CheckpointError, LMConfig, generate, load_checkpoint, load_model
from samu.models.checkpoint import WriteError, atomic_write
from samu.paths import RUN_MARKER, FileLock
from samu.train import TrainConfig, train
from tests.helpers import byte_text as _text

MODEL = LMConfig(width=16, num_layers=2, lru_width=8)


def _config(out, **kw):
    base = dict(model=MODEL, out_dir=str(out), steps=6, batch_size=3, seq_len=24, warmup_steps=2, eval_every=3,
                eval_batches=2, checkpoint_every=3, log_every=1, lr=1e-2, min_lr=1e-3, progress=False)
    return TrainConfig(**{**base, **kw})


class _SignalAt(TokenData):
    """Token data whose sampler sends this process ``signum`` at its ``at``-th batch."""

    def __init__(self, data, at, signum=signal.SIGTERM):
        super().__init__(**{f.name: getattr(data, f.name) for f in dataclasses.fields(TokenData)})
        object.__setattr__(self, "state", [0, at, signum])

    def sample(self, *args):
        self.state[0] += 1
        if self.state[0] == self.state[1]:
            signal.raise_signal(self.state[2])
        return super().sample(*args)


def _same_weights(a, b):
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


# 1. Data identity


def test_a_run_folder_inside_the_data_folder_is_never_read_as_text(tmp_path):
    data_dir = tmp_path / "data"
    _text(data_dir)
    before = text_corpus(data_dir).identity()
    out = data_dir / "run"
    whole = train(_config(tmp_path / "whole", data=str(data_dir)))
    with pytest.raises(TrainingInterrupted):
        train(_config(out, data=str(data_dir)), data=_SignalAt(text_corpus(data_dir), 2))
    # the checkpoint and log now lie inside the data folder; the corpus is the same without them
    assert (out / "checkpoint.pt").exists() and text_corpus(data_dir).identity() == before
    resumed = train(_config(out, data=str(data_dir)), resume=True)
    _same_weights(whole.model, resumed.model)
    assert [v["val_loss"] for v in resumed.log["val"]] == [v["val_loss"] for v in whole.log["val"]]


def test_resume_refuses_other_data_and_records_the_absolute_path(tmp_path, monkeypatch):
    here, there = tmp_path / "here", tmp_path / "there"
    _text(here), _text(there, seed=1)
    monkeypatch.chdir(here)
    with pytest.raises(TrainingInterrupted):
        train(_config(tmp_path / "run", data="corpus.txt"), data=_SignalAt(text_corpus("corpus.txt"), 2))
    payload = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert payload["train"]["data"]["name"] == str(here / "corpus.txt")
    # the same relative name from another folder is another file: refused, naming both
    monkeypatch.chdir(there)
    with pytest.raises(CheckpointError, match=r"trained on .*here/corpus.txt.*data given now are .*there/corpus.txt"):
        train(_config(tmp_path / "run", data="corpus.txt"), resume=True)
    monkeypatch.chdir(here)
    assert train(_config(tmp_path / "run", data="corpus.txt"), resume=True).log["done"]


# 2. Divergence, kept checkpoints


def test_divergence_found_where_a_log_step_is_read_a_step_later_names_the_parameters(tmp_path):
    """No save and no validation before the end: the divergence is found when a log step's values are read (the
    step after it), and nothing is written."""
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path / "run", steps=40, lr=50.0, min_lr=50.0, warmup_steps=0, grad_clip=0,
                     checkpoint_every=100, eval_every=100)
    with pytest.raises(TrainingDiverged, match=r"training diverged at step \d+.*no checkpoint was written.*"
                                               r"\(non-finite: "):
        train(config, data=data)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_divergence_stops_before_saving_and_keeps_the_last_good_checkpoint(tmp_path):
    data = text_corpus(_text(tmp_path))
    config = _config(tmp_path / "run", steps=20, lr=50.0, min_lr=50.0, warmup_steps=0, grad_clip=0,
                     checkpoint_every=1, eval_every=100)
    with pytest.raises(TrainingDiverged, match=r"training diverged at step (\d+).*still holds step") as e:
        train(config, data=data)
    step = int(e.value.args[0].split("at step ")[1].split(":")[0])
    assert "(non-finite: " in e.value.args[0]   # the parameters that hold nan or inf, by name
    payload = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert payload["train"]["step"] == step - 1
    assert all(bool(torch.isfinite(t).all()) for t in payload["model"].values())
    # the kept run loads and is sampled, or, where its finite weights overflow the activations (lr 50),
    # generate says so in one line instead of sampling from nan logits
    model = load_model(tmp_path / "run" / "checkpoint.pt")
    if bool(torch.isfinite(model(torch.tensor([[65]]))[0]).all()):
        generate(model, torch.tensor([65]), 3, temperature=0)
    else:
        with pytest.raises(ValueError, match="logits hold nan or inf while decoding"):
            generate(model, torch.tensor([65]), 3, temperature=0)


def test_keep_holds_the_newest_checkpoints(tmp_path):
    data = text_corpus(_text(tmp_path))
    train(_config(tmp_path / "two", checkpoint_every=1), data=data)
    assert sorted(p.name for p in (tmp_path / "two").glob("checkpoint*.pt")) == ["checkpoint-5.pt", "checkpoint.pt"]
    assert load_checkpoint(tmp_path / "two" / "checkpoint-5.pt")["train"]["step"] == 5
    train(_config(tmp_path / "three", checkpoint_every=2, keep=3), data=data)
    assert sorted(p.name for p in (tmp_path / "three").glob("checkpoint*.pt")) == [
        "checkpoint-2.pt", "checkpoint-4.pt", "checkpoint.pt"]
    train(_config(tmp_path / "one", checkpoint_every=1, keep=1), data=data)
    assert [p.name for p in (tmp_path / "one").glob("checkpoint*.pt")] == ["checkpoint.pt"]


def test_non_finite_parameters_and_zero_norm_directions_are_refused():
    x = torch.randn(1, 4, 8)
    nu, theta_log, directions, amplitudes = torch.zeros(4), torch.zeros(4), torch.randn(2, 8), torch.ones(2, 2)
    with pytest.raises(ValueError, match="directions row 1 has a zero norm"):
        samu.samu_mixer(x, nu, theta_log, torch.stack([directions[0], torch.zeros(8)]), amplitudes)
    with pytest.raises(ValueError, match="non-finite values .* nu"):
        samu.samu_mixer(x, torch.full((4,), float("nan")), theta_log, directions, amplitudes)


def test_generation_refuses_non_finite_weights():
    model = samu.LanguageModel(MODEL)
    with torch.no_grad():
        model.embed.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="weights hold nan or inf"):
        generate(model, torch.tensor([1, 2]), 2)


# 3. The folder lock


def test_a_second_run_into_a_busy_folder_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    out.mkdir()
    with FileLock(out / RUN_MARKER, wait=False):
        with pytest.raises(RunFolderBusy, match="in use by another samu run"):
            train(_config(out, steps=1), data=data)
    assert not (out / "checkpoint.pt").exists()
    # a process that took the lock and was killed leaves the marker but not the lock
    code = f"from samu.paths import FileLock; import os; l = FileLock({str(out / RUN_MARKER)!r}, wait=False).__enter__(); os.kill(os.getpid(), 9)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    assert train(_config(out, steps=1), data=data).log["done"]


# 4. Signals


def test_sigterm_finishes_the_step_saves_and_resume_continues_exactly(tmp_path):
    handler = signal.getsignal(signal.SIGTERM)
    data = text_corpus(_text(tmp_path))
    whole = train(_config(tmp_path / "whole", checkpoint_every=100), data=data)
    with pytest.raises(TrainingInterrupted) as stop:
        train(_config(tmp_path / "parts", checkpoint_every=100), data=_SignalAt(data, 2))
    assert stop.value.signum == signal.SIGTERM and stop.value.step == 2
    assert load_checkpoint(tmp_path / "parts" / "checkpoint.pt")["train"]["step"] == 2
    assert json.loads((tmp_path / "parts" / "log.json").read_text())["train"][-1]["step"] == 2
    resumed = train(_config(tmp_path / "parts", checkpoint_every=100), data=data, resume=True)
    _same_weights(whole.model, resumed.model)
    # time is cumulative over the sessions
    times = [e["time_s"] for e in resumed.log["train"]]
    assert times == sorted(times)
    # the handlers are back as they were
    assert signal.getsignal(signal.SIGTERM) == handler


def test_sigterm_to_samu_train_saves_says_how_to_resume_and_exits_143(tmp_path):
    corpus = _text(tmp_path)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "samu.cli", "train", "--data", str(corpus), "--width", "16", "--layers", "2",
           "--lru-width", "8", "--steps", "100000", "--batch-size", "2", "--seq-len", "24", "--eval-every", "100000",
           "--eval-batches", "1", "--checkpoint-every", "100000", "--device", "cpu", "--no-progress", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        # log.json is written at every log step (10 by default)
        while not (out / "log.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert (out / "log.json").exists(), proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM after step" in err and f"samu train --out {out} --resume" in err
    step = load_checkpoint(out / "checkpoint.pt")["train"]["step"]
    assert step >= 10 and json.loads((out / "log.json").read_text())["checkpoints"] == [step]


# 5, 6. Files that are not samu's, leftovers, write errors


def test_a_foreign_log_is_never_overwritten(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.json").write_text("mine")
    with pytest.raises(FileExistsError, match="no samu run folder owns"):
        train(_config(out, steps=1), data=data)
    with pytest.raises(FileExistsError, match="no samu run folder owns"):
        train(_config(out, steps=1, demo=True), data=data, overwrite=True)
    assert (out / "log.json").read_text() == "mine"


def test_leftover_temporary_files_are_removed_at_the_next_start(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(_config(out), data=_SignalAt(data, 2))
    left = [out / ".checkpoint.pt.x1y2.tmp", out / ".log.json.abc.tmp"]
    for p in left:
        p.write_bytes(b"partial")
    train(_config(out), data=data, resume=True)
    assert not any(p.exists() for p in left)


def test_write_errors_are_one_line_naming_the_path_and_cause(tmp_path):
    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"cannot write .*ckpt.pt: No space left on device; \d+ MiB free there"):
        atomic_write(tmp_path / "ckpt.pt", full)

    def torch_full(tmp):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4015232 vs 4015124")

    with pytest.raises(WriteError, match=r"cannot write .*ckpt.pt: the write failed \(.*unexpected pos"):
        atomic_write(tmp_path / "ckpt.pt", torch_full)
    assert list(tmp_path.iterdir()) == []


# 7. Token files


def test_implausible_token_files_are_refused(tmp_path):
    stray = tmp_path / "stray.u32"
    ids = np.arange(1000, dtype=np.uint32) % 50
    ids[500] = 2**31
    ids.tofile(stray)
    with pytest.raises(ValueError, match=r"token id 2147483648 \(first id >= 16777216 at position 500\)"):
        token_file(stray, "uint32")
    text = tmp_path / "notes.txt"
    text.write_text("tokens are not text, and this is text\n" * 200)
    utf16 = tmp_path / "notes16.txt"
    utf16.write_text("tokens are not text\n" * 200, encoding="utf-16")
    for path, dtype in [(text, "uint16"), (text, "uint32"), (utf16, "uint16")]:
        with pytest.raises(ValueError, match="looks like text"):
            token_file(path, dtype)
    wide = tmp_path / "wide.u32"
    (np.arange(4000, dtype=np.uint32) % 50000 + 1).tofile(wide)
    with pytest.raises(ValueError, match="every second uint16 id is 0.*uint32"):
        token_file(wide, "uint16")
    assert token_file(wide, "uint32").vocab_size == 4001


def test_samu_train_prints_the_inferred_vocabulary(tmp_path, capsys):
    from samu.cli import main

    tokens = tmp_path / "tokens.u16"
    (np.arange(3000) % 97).astype(np.uint16).tofile(tokens)
    assert main(["train", "--data", str(tokens), "--data-format", "uint16", "--out", str(tmp_path / "run"),
                 "--steps", "1", "--width", "16", "--layers", "1", "--seq-len", "16", "--batch-size", "2",
                 "--eval-batches", "1", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "3000 uint16 tokens, vocabulary 97" in out and "done: 1 steps" in out


# 9. Messages


def test_messages_name_the_users_flag_and_refuse_bad_input(tmp_path, capsys):
    from samu.cli import main

    assert main(["train", "--width", "7", "--out", str(tmp_path / "r")]) == 1
    assert "--width (the mixer width when --lru-width is unset) must be even" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no such folder"):
        main(["report", "--results", str(tmp_path / "typo")])
    assert not (tmp_path / "typo").exists()
    with pytest.raises(SystemExit):
        main(["bench", "--device", "tpu"])
    assert "expected cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err
    # an empty --data would read the working folder, every file under it, as text
    assert main(["train", "--data", "", "--out", str(tmp_path / "e")]) == 1
    assert "data must be 'stdlib' or the path of a text file, folder or token file, got ''" in capsys.readouterr().err
    assert main(["train", "--preset", "", "--out", str(tmp_path / "p")]) == 1
    assert "unknown preset ''" in capsys.readouterr().err
    # samu compare checks where it will write its record before it trains
    (tmp_path / "a_file").write_text("")
    assert main(["compare", "--results", str(tmp_path / "a_file"), "--out", str(tmp_path / "c")]) == 1
    assert "--results '" in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_an_interrupted_study_says_to_run_it_again(tmp_path, capsys, monkeypatch):
    import samu.compare
    from samu.cli import main

    def stopped(study, out, progress):
        raise TrainingInterrupted(signal.SIGTERM, 1, 9, Path(out) / "samu-L2048-s0")

    monkeypatch.setattr(samu.compare, "run_study", stopped)
    assert main(["compare", "--out", str(tmp_path / "study"), "--results", str(tmp_path / "records")]) == 143
    assert "resume with the same `samu compare` command" in capsys.readouterr().err


def test_an_invalid_utf8_prompt_is_used_as_bytes(tmp_path, capsys):
    from samu.cli import main
    from samu.models import save_checkpoint

    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.pt", samu.LanguageModel(MODEL))
    prompt = b"ab\xff".decode("utf-8", "surrogateescape")
    assert main(["generate", str(tmp_path / "m.pt"), "--prompt", prompt, "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("ab\ufffd")


def test_resume_says_where_it_starts(tmp_path, capsys):
    data = text_corpus(_text(tmp_path))
    with pytest.raises(TrainingInterrupted):
        train(_config(tmp_path / "run"), data=_SignalAt(data, 3))
    capsys.readouterr()
    train(_config(tmp_path / "run"), data=data, resume=True)
    out = capsys.readouterr().out
    assert f"resuming {tmp_path / 'run'} at step 3 of 6" in out and "done: 6 steps" in out


def test_an_unfinished_run_with_a_changed_keep_resumes(tmp_path):
    """--keep is not part of the optimisation: a resume may change it."""
    data = text_corpus(_text(tmp_path))
    with pytest.raises(TrainingInterrupted):
        train(_config(tmp_path / "run", checkpoint_every=1), data=_SignalAt(data, 3))
    train(dataclasses.replace(_config(tmp_path / "run", checkpoint_every=1), keep=1), data=data, resume=True)
    assert [p.name for p in (tmp_path / "run").glob("checkpoint*.pt")] == ["checkpoint.pt"]


def test_the_data_folder_cannot_be_the_run_folder(tmp_path):
    data_dir = tmp_path / "data"
    _text(data_dir)
    with pytest.raises(ValueError, match="is the data folder"):
        train(_config(data_dir, data=str(data_dir)))
    assert not (data_dir / RUN_MARKER).exists()


def test_pruning_and_keeping_never_touch_a_checkpoint_this_run_did_not_write(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted):
        train(_config(out, checkpoint_every=1), data=_SignalAt(data, 3))
    # files put into the folder between two sessions of the run, one under the name its current step would be kept as
    step = load_checkpoint(out / "checkpoint.pt")["train"]["step"]
    for name in ("checkpoint-1000.pt", f"checkpoint-{step}.pt"):
        (out / name).write_bytes(b"the user's own")
    with pytest.warns(UserWarning, match=f"checkpoint-{step}.pt is not this run's"):
        train(_config(out, checkpoint_every=1), data=data, resume=True)
    for name in ("checkpoint-1000.pt", f"checkpoint-{step}.pt"):
        assert (out / name).read_bytes() == b"the user's own"
    assert sorted(p.name for p in out.glob("checkpoint*.pt")) == sorted(
        ["checkpoint-1000.pt", f"checkpoint-{step}.pt", "checkpoint-5.pt", "checkpoint.pt"])


def test_a_run_whose_checkpoint_is_gone_is_neither_trained_over_nor_replaced_by_a_demo(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    train(_config(out, checkpoint_every=2, keep=3), data=data)
    (out / "checkpoint.pt").unlink()   # the final model moved elsewhere
    before = {p.name: p.read_bytes() for p in out.glob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="holds log.json, checkpoint-2.pt, checkpoint-4.pt but no checkpoint.pt; "
                                              "samu never overwrites a run's files"):
        train(_config(out), data=data)
    result = subprocess.run([sys.executable, "-m", "samu.cli", "demo", "--steps", "1", "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "which samu demo did not write" in result.stderr
    assert {p.name: p.read_bytes() for p in out.glob("*") if p.is_file()} == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "checkpoint-2.pt").write_bytes(b"the user's own")
    with pytest.raises(FileExistsError, match="holds checkpoint-2.pt but no checkpoint.pt"):
        train(_config(foreign), data=data)
    assert (foreign / "checkpoint-2.pt").read_bytes() == b"the user's own"
    # a file or folder named checkpoint that is not samu's link (another tool's) stops a new run before it starts
    for kind in ("file", "folder"):
        other = tmp_path / kind
        other.mkdir()
        if kind == "folder":
            (other / "checkpoint").mkdir()
        else:
            (other / "checkpoint").write_text("model_checkpoint_path")
        with pytest.raises(FileExistsError, match="holds checkpoint, which samu never writes there"):
            train(_config(other), data=data)
        assert (other / "checkpoint").exists()


def test_a_run_that_saved_nothing_starts_again_in_its_folder_and_its_log_is_kept(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    out.mkdir()
    # what a run killed (SIGKILL) before its first save leaves: the folder's marker and a log with no checkpoint
    (out / RUN_MARKER).write_text("")
    (out / "log.json").write_text(json.dumps({"run_id": "dead", "train": [{"step": 1}], "checkpoints": []}))
    with pytest.warns(UserWarning, match="kept as log-dead.json"):
        train(_config(out, steps=2), data=data)
    assert json.loads((out / "log-dead.json").read_text())["train"] == [{"step": 1}]
    assert load_checkpoint(out / "checkpoint.pt")["train"]["step"] == 2


def test_a_replaced_demo_run_takes_only_its_own_checkpoints_along(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "demo"
    train(_config(out, steps=4, checkpoint_every=2, demo=True), data=data, overwrite=True)
    (out / "checkpoint-1000.pt").write_bytes(b"the user's own")
    train(_config(out, steps=2, demo=True), data=data, overwrite=True)
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint-1000.pt", "checkpoint.pt"]
    assert (out / "checkpoint-1000.pt").read_bytes() == b"the user's own"


def test_the_data_may_be_a_path(tmp_path):
    config = _config(tmp_path / "run", data=_text(tmp_path))
    assert isinstance(config.data, str) and config.data == str(_text(tmp_path))


def test_a_checkpoint_from_before_data_identities_resumes_and_checks_token_counts(tmp_path, monkeypatch):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "run"
    whole = train(_config(tmp_path / "whole"), data=data)
    with pytest.raises(TrainingInterrupted):
        train(_config(out), data=_SignalAt(data, 3))
    # what an older samu wrote: no data identity, no session time, a relative data path, no keep
    path = out / "checkpoint.pt"
    payload = torch.load(path, weights_only=True)
    for key in ("data", "time_s"):
        del payload["train"][key]
    config = json.loads(payload["train"]["config"])
    del config["keep"]
    payload["train"]["config"] = json.dumps(config)
    torch.save(payload, path)
    (out / RUN_MARKER).unlink()
    other = text_corpus(_text(tmp_path / "other", seed=3))
    other = TokenData(other.name, other.train[:-7], other.val, other.vocab_size, other.bytes_per_token)
    with pytest.raises(CheckpointError, match="the data given now have"):
        train(_config(out), data=other, resume=True)
    _same_weights(whole.model, train(_config(out), data=data, resume=True).model)


def test_a_replaced_demo_run_leaves_none_of_its_checkpoints(tmp_path):
    data = text_corpus(_text(tmp_path))
    out = tmp_path / "demo"
    train(_config(out, steps=3, demo=True), data=data, overwrite=True)
    train(_config(out, steps=2, demo=True), data=data, overwrite=True)
    # the first run's checkpoint.pt (step 3) would otherwise be kept as checkpoint-3.pt of the second
    assert sorted(p.name for p in out.glob("checkpoint*")) == ["checkpoint.pt"]
    assert load_checkpoint(out / "checkpoint.pt")["train"]["step"] == 2
