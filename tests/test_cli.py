"""The samu command: train, resume, generate, demo, info, and one-line errors that write nothing."""

import json
import os

import numpy as np
import pytest
import torch

import samu
from samu.cli import main
from samu.models import load_checkpoint
from samu.train import TrainConfig, train

TINY = ["--width", "16", "--layers", "2", "--lru-width", "8", "--batch-size", "2", "--seq-len", "16",
        "--eval-batches", "1", "--warmup", "1", "--no-progress"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"def f(x):\n    return x + 1\n" * 200)
    return path


def _one_line_error(capsys, command):
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"samu {command}: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_train_resume_generate(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "2", *TINY]) == 0
    # --no-progress hides the bar, not the validation results.
    text = capsys.readouterr().out
    assert "step 0: validation loss" in text and "step 2: validation loss" in text
    before = (out / "checkpoint.pt").read_bytes(), (out / "log.json").read_bytes()
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert "holds a finished run (2 steps); nothing to do" in capsys.readouterr().out
    assert ((out / "checkpoint.pt").read_bytes(), (out / "log.json").read_bytes()) == before
    assert main(["train", "--out", str(out), "--resume", "--steps", "4"]) == 1
    assert "--steps (2 there, 4 here)" in _one_line_error(capsys, "train")
    assert main(["generate", str(out / "checkpoint.pt"), "--prompt", "def", "--max-new-tokens", "7",
                 "--seed", "1"]) == 0
    text = capsys.readouterr().out[:-1]
    # 7 new bytes decode to 2 (4-byte UTF-8 sequences) to 7 characters.
    assert text.startswith("def") and 3 + 2 <= len(text) <= 3 + 7
    # A run folder stands for its checkpoint.
    assert main(["generate", str(out), "--prompt-ids", "100,101", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("de")
    # a batch of prompts of different lengths, each continued as if alone; the rates on stderr
    assert main(["generate", str(out), "--prompt", "ab", "--prompt", "def x", "--max-new-tokens", "4",
                 "--temperature", "0", "--dtype", "bfloat16"]) == 0
    captured = capsys.readouterr()
    first, second = captured.out[:-1].split("\n---\n")
    assert first.startswith("ab") and second.startswith("def x")
    # 4 new tokens a row: the first from the prefill, 3 by decoding steps
    assert "prefill: 7 tokens" in captured.err and "decode: 6 tokens" in captured.err and "batch 2" in captured.err


def test_generate_streams_one_prompt_and_an_interrupt_keeps_what_came(tmp_path, corpus, capsys, monkeypatch):
    import importlib

    from samu.models import load_model

    gen_module = importlib.import_module("samu.models.generate")
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", *TINY]) == 0
    capsys.readouterr()
    want = gen_module.generate(load_model(out / "checkpoint.pt"), torch.tensor(list(b"ab")), 9, temperature=0)
    monkeypatch.setattr(gen_module, "CHUNK", 4)   # 9 new tokens come in chunks of 4, 4 and 1
    command = ["generate", str(out), "--prompt", "ab", "--max-new-tokens", "9", "--temperature", "0"]
    assert main(command) == 0
    assert capsys.readouterr().out == bytes(want.tolist()).decode("utf-8", errors="replace") + "\n"
    # an interrupt as the second chunk is written: the prompt and 8 tokens are out, the exit is 130
    written = []
    real = samu.cli._Stream.write_rows

    def write_then_interrupt(self, rows):
        real(self, rows)
        written.append(rows.shape)
        if len(written) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(samu.cli._Stream, "write_rows", write_then_interrupt)
    assert main(command) == 130
    captured = capsys.readouterr()
    assert written == [(1, 4), (1, 4)] and "interrupted" in captured.err
    assert captured.out == bytes(want[:2 + 8].tolist()).decode("utf-8", errors="replace") + "\n"
    # several prompts: printed at the end; interrupted after the first chunk, each with its first 4 tokens
    batch = ["generate", str(out), "--prompt", "ab", "--prompt", "ab", "--max-new-tokens", "9", "--temperature", "0"]
    assert main(batch) == 0
    first, second = capsys.readouterr().out[:-1].split("\n\n---\n")
    assert first == second == bytes(want.tolist()).decode("utf-8", errors="replace")
    real_run = gen_module.Decoder.run

    def run_then_interrupt(self, model, logits, n, generator, on_tokens=None):
        def first_chunk_only(rows):
            on_tokens(rows)
            raise KeyboardInterrupt
        return real_run(self, model, logits, n, generator, first_chunk_only)

    monkeypatch.setattr(gen_module.Decoder, "run", run_then_interrupt)
    assert main(batch) == 130
    first, second = capsys.readouterr().out[:-1].split("\n\n---\n")
    assert first == second == bytes(want[:2 + 4].tolist()).decode("utf-8", errors="replace")


def test_no_deterministic_reaches_the_run(tmp_path, corpus):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", "--no-deterministic", *TINY]) == 0
    assert json.loads((out / "log.json").read_text())["config"]["deterministic"] is False


def test_token_ids_read_as_text_are_warned_about_in_one_line(tmp_path, capsys):
    tokens = tmp_path / "tokens.bin"
    (np.arange(3000) % 97 + 1000).astype(np.uint16).tofile(tokens)
    assert main(["train", "--data", str(tokens), "--out", str(tmp_path / "run"), "--steps", "1", *TINY]) == 0
    err = capsys.readouterr().err
    line = [l for l in err.splitlines() if "does not look like text" in l]
    assert line == [f"samu: warning: data file {tokens} does not look like text (its start is not printable UTF-8); "
                    f"it is read as bytes: if it holds token ids, give its data format (uint16 or uint32, "
                    f"--data-format)"] and "UserWarning" not in err


def test_running_out_of_memory_is_one_line(tmp_path, corpus, capsys, monkeypatch):
    def exhausted(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 512000000000 bytes.")

    monkeypatch.setattr("samu.train.train", exhausted)
    assert main(["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--steps", "1", *TINY]) == 1
    assert "error: out of memory ([enforce fail" in _one_line_error(capsys, "train")


def test_resuming_a_run_still_in_progress_says_so(tmp_path, capsys):
    from samu.paths import RUN_MARKER, FileLock

    out = tmp_path / "run"
    out.mkdir()
    with FileLock(out / RUN_MARKER):   # a run that has not saved its first checkpoint yet
        assert main(["train", "--out", str(out), "--resume"]) == 1
    assert "is in use by another samu run" in _one_line_error(capsys, "train")


def test_empty_paths_are_refused(tmp_path, corpus, capsys):
    assert main(["train", "--data", str(corpus), "--out", "", "--steps", "1", *TINY]) == 1
    assert "--out must name a folder, got ''" in _one_line_error(capsys, "train")
    assert main(["generate", ""]) == 1
    assert "checkpoint must name a run folder" in _one_line_error(capsys, "generate")


def test_train_on_a_token_file(tmp_path, capsys):
    tokens = tmp_path / "tokens.bin"
    (np.arange(3000) % 97).astype(np.uint16).tofile(tokens)
    out = tmp_path / "run"
    assert main(["train", "--data", str(tokens), "--data-format", "uint16", "--out", str(out), "--steps", "1",
                 *TINY]) == 0
    assert "bits/byte" not in capsys.readouterr().out
    assert main(["generate", str(out / "checkpoint.pt"), "--max-new-tokens", "2"]) == 1
    assert "pass --prompt-ids" in _one_line_error(capsys, "generate")
    assert main(["generate", str(out / "checkpoint.pt"), "--prompt-ids", "5 6", "--max-new-tokens", "3"]) == 0
    tokens = capsys.readouterr().out.split()
    assert tokens[:2] == ["5", "6"] and len(tokens) == 2 + 3


@pytest.mark.parametrize("argv,command,message", [
    (["train", "--data", "/no/such/path"], "train", "data path not found: /no/such/path"),
    (["train", "--preset", "huge"], "train", "unknown preset 'huge'"),
    (["train", "--mixer", "samu", "--lru-width", "7"], "train", "--lru-width must be even"),
    (["train", "--device", "foo"], "train", "--device must be auto, cpu, cuda or cuda:N, got 'foo'"),
    (["demo", "--device", "foo"], "demo", "--device must be auto, cpu, cuda or cuda:N, got 'foo'"),
    (["generate", "/no/such.pt", "--device", "foo"], "generate", "--device must be auto, cpu, cuda"),
    (["generate", "/no/such.pt", "--prompt", "a", "--prompt-ids", "1"], "generate",
     "give --prompt or --prompt-ids, not both"),
    (["demo", "--device", "mps"], "demo", "--device must be auto, cpu, cuda or cuda:N, got 'mps'"),
    (["train", "--device", "meta"], "train", "--device must be auto, cpu, cuda or cuda:N, got 'meta'"),
    (["generate", "/no/such.pt"], "generate", "checkpoint not found"),
])
def test_user_errors_are_one_line_and_write_nothing(tmp_path, argv, command, message, capsys):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command != "generate" else []
    assert main(argv + extra) == 1
    assert message in _one_line_error(capsys, command)
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "demo"])
def test_a_bad_out_is_refused_before_any_work(tmp_path, corpus, command, monkeypatch, capsys):
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    argv = [command, "--steps", "1", "--no-progress"] + (["--data", str(corpus), *TINY] if command == "train" else [])
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for out, message in [(a_file, "exists and is not a folder"), (a_file / "run", "cannot be created"),
                         ("/proc/forbidden/run", "is not writable"), (dangling, "is a link to nothing")]:
        assert main([*argv, "--out", str(out)]) == 1
        assert f"--out '{out}' {message}" in _one_line_error(capsys, command)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "dangling", "text.txt"]
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main([*argv, "--out", str(locked / "run")]) == 1
        assert "is not writable" in _one_line_error(capsys, command)
        assert list(locked.iterdir()) == []


def test_corrupt_checkpoint(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", *TINY]) == 0
    ckpt = out / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    capsys.readouterr()
    assert main(["generate", str(ckpt)]) == 1
    assert "not a readable checkpoint" in _one_line_error(capsys, "generate")
    assert main(["train", "--out", str(out), "--resume"]) == 1
    assert "not a readable checkpoint" in _one_line_error(capsys, "train")


def test_existing_run_is_not_overwritten(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", *TINY]) == 0
    before = (out / "checkpoint.pt").read_bytes(), (out / "log.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--data", str(corpus), "--out", str(out), "--steps", "1", *TINY]) == 1
    assert "already holds a run" in _one_line_error(capsys, "train")
    assert ((out / "checkpoint.pt").read_bytes(), (out / "log.json").read_bytes()) == before


@pytest.mark.parametrize("argv,message", [
    (["train", "--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    (["train", "--warmup", "-1"], "argument --warmup: must be a non-negative integer, got -1"),
    (["train", "--lr", "abc"], "argument --lr: expected a number, got 'abc'"),
    (["train", "--lr", "nan"], "argument --lr: must be a finite number >= 0, got nan"),
    (["train", "--lr", "1e400"], "argument --lr: must be a finite number >= 0, got inf"),
    (["generate", "x.pt", "--temperature", "-1"], "argument --temperature: must be a finite number >= 0"),
    (["train", "--mixer", "lstm"], "argument --mixer: invalid choice"),
])
def test_bad_numbers_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def _demo(out, *extra):
    return main(["demo", "--steps", "1", "--out", str(out), "--sample-bytes", "20", "--no-progress",
                 "--device", "cpu", *extra])


def test_demo_runs_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    threads = torch.get_num_threads()
    assert _demo(out) == 0
    text = capsys.readouterr().out
    assert "building the byte-level corpus" in text and "on cpu (1 thread)" in text
    summary = text.split("validation bits/byte: ")[1].splitlines()[0]
    before = float(summary.split(" before training, ")[0])
    after = float(summary.split(" before training, ")[1].split(" after ")[0])
    assert after < before
    assert "sample (prompt 'def '" in text
    payload = load_checkpoint(out / "checkpoint.pt")
    assert payload["train"]["step"] == 1
    # The demo trained on one thread and gave the process its thread count back.
    assert json.loads((out / "log.json").read_text())["cpu_threads"] == 1
    assert torch.get_num_threads() == threads
    # A second demo replaces the first, with the corpus already built.
    assert _demo(out, "--seed", "1") == 0
    assert "building" not in capsys.readouterr().out
    assert json.loads(load_checkpoint(out / "checkpoint.pt")["train"]["config"])["seed"] == 1


def test_demo_keeps_any_other_run(tmp_path, corpus, monkeypatch, capsys):
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    config = TrainConfig(model=samu.LMConfig(width=16, num_layers=1, lru_width=8), data=str(corpus),
                         out_dir=str(out), steps=1, batch_size=2, seq_len=16, eval_batches=1, progress=False)
    train(config)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "checkpoint.pt").write_text("not a checkpoint")
    for folder in (out, garbage):
        before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
        capsys.readouterr()
        assert _demo(folder) == 1
        assert "which samu demo did not write" in _one_line_error(capsys, "demo")
        assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before
    assert not (tmp_path / "cache").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"samu {samu.__version__}"


def test_info(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert f"torch {torch.__version__}" in text and "dispatch on " in text and "samu (1, 2048, 1024)" in text
