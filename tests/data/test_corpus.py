"""Embedded stdlib corpus, text and token-file loaders, batch sampling."""

import shutil
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch

from samu.data import corpus, load_data, stdlib_corpus, stdlib_files, text_corpus, token_file


def test_stdlib_files_are_sorted_and_exclude_site_packages():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert len(files) > 100 and rel == sorted(rel)
    assert all(f.suffix == ".py" for f in files)
    assert not any("site-packages" in r.split("/") for r in rel)
    assert "os.py" in rel


def test_stdlib_corpus_split_by_file_and_cached(tmp_path, monkeypatch):
    data = stdlib_corpus(tmp_path)
    files = stdlib_files()
    val_files = files[corpus.VAL_EVERY - 1::corpus.VAL_EVERY]
    assert len(val_files) == len(files) // 100
    assert bytes(data.val) == b"".join(f.read_bytes() for f in val_files)
    assert len(data.train) + len(data.val) == sum(f.stat().st_size for f in files)
    assert data.vocab_size == 256 and data.bytes_per_token == 1.0 and data.train.dtype == np.uint8
    # one document a file: each split's starts are its files' running sizes
    for split, chosen in (("train", [f for i, f in enumerate(files) if i % corpus.VAL_EVERY != corpus.VAL_EVERY - 1]),
                          ("val", val_files)):
        sizes = [f.stat().st_size for f in chosen]
        starts = np.unique(np.cumsum([0] + sizes[:-1]))
        assert np.array_equal(getattr(data, f"{split}_docs"), starts)
    [folder] = tmp_path.iterdir()
    assert f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}" in folder.name

    def no_rebuild(*args):
        raise AssertionError("the cached corpus was rebuilt")

    monkeypatch.setattr(corpus, "_build_stdlib", no_rebuild)
    again = stdlib_corpus(tmp_path)
    assert np.array_equal(again.val, data.val) and len(again.train) == len(data.train)


def test_stdlib_corpus_default_cache_location(tmp_path, monkeypatch):
    monkeypatch.delenv("SAMU_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert corpus.cache_dir() == tmp_path / "samu"
    monkeypatch.setenv("SAMU_CACHE", str(tmp_path / "elsewhere"))
    assert corpus.cache_dir() == tmp_path / "elsewhere"


def test_text_file_and_folder(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(bytes(range(200)))
    data = text_corpus(f, val_fraction=0.1)
    assert bytes(data.train) + bytes(data.val) == bytes(range(200)) and len(data.val) == 20
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_bytes(b"B" * 50)
    (folder / "sub" / "a.txt").write_bytes(b"A" * 50)
    (folder / "a.txt").write_bytes(b"C" * 50)
    (folder / ".hidden").write_bytes(b"H" * 50)
    data = load_data(str(folder))
    assert bytes(data.train) + bytes(data.val) == b"C" * 50 + b"B" * 50 + b"A" * 50


def test_token_files(tmp_path):
    for dtype in ("uint16", "uint32"):
        tokens = (np.arange(1000) * 37 % 50_000).astype(dtype)
        path = tmp_path / f"tokens.{dtype}"
        tokens.tofile(path)
        data = load_data(str(path), dtype)
        assert np.array_equal(np.concatenate([data.train, data.val]), tokens)
        assert data.vocab_size == int(tokens.max()) + 1 and data.bytes_per_token is None
        assert isinstance(data.train.base, np.memmap) or isinstance(data.train, np.memmap)


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data path not found"):
        load_data(str(tmp_path / "missing.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        text_corpus(tmp_path / "empty")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="not a positive multiple of 2"):
        token_file(odd, "uint16")
    with pytest.raises(ValueError, match="token dtype must be one of"):
        token_file(odd, "int8")
    with pytest.raises(ValueError, match="data format must be one of"):
        load_data(str(odd), "bytes")
    with pytest.raises(ValueError, match="val_fraction"):
        text_corpus(odd, val_fraction=1.5)
    with pytest.raises(ValueError, match="stdlib corpus is byte-level"):
        load_data("stdlib", "uint16")


def test_sampling_is_seeded_and_shifted(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)))
    data = text_corpus(f)
    x1, y1, none = data.sample(7, 33, np.random.default_rng([1, 2]))
    x2, y2, _ = data.sample(7, 33, np.random.default_rng([1, 2]))
    x3, _, _ = data.sample(7, 33, np.random.default_rng([1, 3]))
    assert none is None
    assert x1.shape == y1.shape == (7, 33) and x1.dtype == y1.dtype
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2) and not np.array_equal(x1, x3)
    assert np.array_equal(x1[:, 1:], y1[:, :-1])
    train = bytes(data.train)
    for row, target in zip(x1.tolist(), y1.tolist()):
        assert bytes(row + target[-1:]) in train


def test_validation_windows_are_fixed_and_in_range(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(bytes(range(256)) * 40)
    data = text_corpus(f, val_fraction=0.2)
    starts = data.val_starts(seq_len=16, count=9)
    assert np.array_equal(starts, data.val_starts(16, 9))
    assert starts[0] == 0 and starts[-1] == len(data.val) - 17
    x, y = data.windows("val", starts, 16)
    assert np.array_equal(x[0].numpy(), np.asarray(data.val[:16]))
    data.check(len(data.val) - 1)
    with pytest.raises(ValueError, match="the val split has"):
        data.check(len(data.val))


def test_stdlib_corpus_tolerates_a_concurrent_build(tmp_path, monkeypatch):
    data = stdlib_corpus(tmp_path)
    [folder] = tmp_path.iterdir()
    shutil.rmtree(folder)
    build = corpus._build_stdlib

    def another_process_finishes_first(root, out):
        folder.mkdir()
        build(root, folder)
        return build(root, out)

    monkeypatch.setattr(corpus, "_build_stdlib", another_process_finishes_first)
    assert np.array_equal(stdlib_corpus(tmp_path).val, data.val)
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_documents_of_a_text_folder_and_packed_offsets(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    texts = [b"a" * 30, b"", b"b" * 7, b"c" * 1, b"d" * 40, b"e" * 22]
    for i, t in enumerate(texts):
        (folder / f"{i}.txt").write_bytes(t)
    data = text_corpus(folder, val_fraction=0.25)
    # 100 bytes; the last 25 are validation text, which begins inside "d"
    assert len(data.train) == 75 and len(data.val) == 25
    assert data.train_docs.tolist() == [0, 30, 37, 38] and data.val_docs.tolist() == [0, 3]
    # windows of 10 from 25 (a to 30, then b) and from 33 (b, then c at 37 and d at 38)
    cu = data.packed("train", [25, 33], 10)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 5, 10, 14, 15, 20]
    x, _ = data.windows("train", [25, 33], 10)
    flat = bytes(x.flatten().tolist())
    docs = [flat[a:b] for a, b in zip(cu.tolist(), cu.tolist()[1:])]
    assert docs == [b"a" * 5, b"b" * 5, b"b" * 4, b"c", b"d" * 5]
    # a window starting on a boundary opens it itself; none inside it is repeated
    assert data.packed("train", [30], 8).tolist() == [0, 7, 8]
    assert data.packed("val", [0, 2], 4).tolist() == [0, 3, 4, 5, 8]
    x, y, cu = data.sample(3, 9, np.random.default_rng(0), pack=True)
    assert x.shape == (3, 9) and cu[0] == 0 and cu[-1] == 27 and (cu.diff() > 0).all()
    single = tmp_path / "one.txt"
    single.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="pack: the data .* have no document boundaries"):
        text_corpus(single).packed("train", [0], 10)
