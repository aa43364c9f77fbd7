"""The samu command: train, resume, generate, demo, info, and one-line errors that write nothing."""

import json

import numpy as np
import pytest
import torch

from samu.cli import main
from samu.models import load_checkpoint

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
    assert "validation loss" in capsys.readouterr().out
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 0
    assert json.loads((out / "log.json").read_text())["resumed_at"] == [2]
    assert main(["train", "--out", str(out), "--resume", "--steps", "4"]) == 1
    assert "steps (2 there, 4 here)" in _one_line_error(capsys, "train")
    assert main(["generate", str(out / "checkpoint.pt"), "--prompt", "def", "--max-new-tokens", "7",
                 "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def") and len(text.rstrip("\n").encode()) >= 3
    assert main(["generate", str(out / "checkpoint.pt"), "--prompt-ids", "100,101", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("de")


def test_train_on_a_token_file(tmp_path, capsys):
    tokens = tmp_path / "tokens.bin"
    (np.arange(3000) % 97).astype(np.uint16).tofile(tokens)
    out = tmp_path / "run"
    assert main(["train", "--data", str(tokens), "--data-format", "uint16", "--out", str(out), "--steps", "1",
                 *TINY]) == 0
    assert "bits/byte" not in capsys.readouterr().out
    assert main(["generate", str(out / "checkpoint.pt"), "--max-new-tokens", "2"]) == 1
    assert "pass --prompt-ids" in _one_line_error(capsys, "generate")
    assert main(["generate", str(out / "checkpoint.pt"), "--prompt-ids", "5 6", "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["5", "6"]


@pytest.mark.parametrize("argv,command,message", [
    (["train", "--data", "/no/such/path"], "train", "data path not found: /no/such/path"),
    (["train", "--preset", "huge"], "train", "unknown preset 'huge'"),
    (["train", "--mixer", "samu", "--lru-width", "7"], "train", "lru_width must be even"),
    (["generate", "/no/such.pt"], "generate", "checkpoint not found"),
])
def test_user_errors_are_one_line_and_write_nothing(tmp_path, argv, command, message, capsys):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command == "train" else []
    assert main(argv + extra) == 1
    assert message in _one_line_error(capsys, command)
    assert not out.exists()


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
    (["train", "--steps", "0"], "argument --steps: must be > 0, got '0'"),
    (["train", "--lr", "abc"], "argument --lr: expected a number, got 'abc'"),
    (["train", "--lr", "nan"], "argument --lr: must be >= 0.0, got 'nan'"),
    (["generate", "x.pt", "--temperature", "-1"], "argument --temperature: must be >= 0.0"),
    (["train", "--mixer", "lstm"], "argument --mixer: invalid choice"),
])
def test_bad_numbers_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_demo_runs_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    out.mkdir()
    (out / "checkpoint.pt").write_text("an earlier demo's checkpoint, replaced by this one")
    threads = torch.get_num_threads()
    try:
        assert main(["demo", "--steps", "1", "--out", str(out), "--sample-bytes", "20", "--no-progress",
                     "--device", "cpu"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert "on cpu (1 thread)" in text
    summary = text.split("validation bits/byte: ")[1].splitlines()[0]
    before = float(summary.split(" before training, ")[0])
    after = float(summary.split(" before training, ")[1].split(" after ")[0])
    assert after < before
    assert "sample (prompt 'def '" in text
    assert load_checkpoint(out / "checkpoint.pt")["train"]["step"] == 1


def test_info(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert f"torch {torch.__version__}" in text and "dispatch on " in text and "samu (1, 2048, 1024)" in text
