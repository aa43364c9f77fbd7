"""Token data for training: the embedded stdlib corpus, the user's text, pre-tokenized files."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from samu.paths import RUN_MARKER, cache_dir

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
# The largest vocabulary a token file may imply: an embedding of 2^24 rows is already beyond any
# tokenizer in use; a larger id is a stray value or a file read with the wrong dtype.
MAX_VOCAB = 2**24
# Every 100th file of the sorted stdlib listing is validation text: a fixed 99/1 split by file.
VAL_EVERY = 100


@dataclass(frozen=True)
class TokenData:
    """A train and a validation token stream (1-D integer arrays, memory-mapped where possible).

    ``bytes_per_token`` is 1.0 for byte-level text (so bits per byte can be reported), else None.
    ``train_docs`` and ``val_docs`` hold where each document of a split starts (sorted int64 offsets, 0
    first) where the data has documents (the embedded corpus and text folders: one document a file), else
    None; packed batches (``pack``) keep those boundaries.
    """

    name: str
    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    bytes_per_token: float | None = None
    train_docs: np.ndarray | None = None
    val_docs: np.ndarray | None = None

    def check(self, seq_len: int) -> None:
        """Both splits must hold at least one window of ``seq_len`` + 1 tokens."""
        for split in ("train", "val"):
            n = len(getattr(self, split))
            if n < seq_len + 1:
                raise ValueError(f"{self.name}: the {split} split has {n} tokens; seq_len={seq_len} "
                                 f"needs at least {seq_len + 1} (use a shorter --seq-len or more data)")

    def windows(self, split: str, starts, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, [len(starts), seq_len] int64 each, from window ``starts``."""
        tokens = self.train if split == "train" else self.val
        rows = np.stack([np.asarray(tokens[s:s + seq_len + 1], dtype=np.int64) for s in starts])
        rows = torch.from_numpy(rows)
        return rows[:, :-1], rows[:, 1:]

    def require_documents(self) -> None:
        """What packing needs: document boundaries in both splits (else a ValueError naming pack)."""
        if self.train_docs is None or self.val_docs is None:
            raise ValueError(f"pack: the data {self.name} have no document boundaries (a single file or token "
                             f"ids); packing needs the embedded corpus or a folder of text files, one document "
                             f"a file")

    def packed(self, split: str, starts, seq_len: int) -> torch.Tensor:
        """cu_seqlens (int32 [N + 1], samu.ops.packing) of the windows ``starts`` laid end to end along one
        row of len(starts) * seq_len tokens: every window begins a sequence, and so does every document that
        begins inside one, so that no state crosses from one document into the next."""
        self.require_documents()
        docs = self.train_docs if split == "train" else self.val_docs
        offsets = [0]
        for i, s in enumerate(np.asarray(starts, dtype=np.int64)):
            # documents d with s < d < s + seq_len begin inside the window, at position d - s
            lo, hi = np.searchsorted(docs, [s + 1, s + seq_len])
            offsets += (i * seq_len + docs[lo:hi] - s).tolist()
            offsets.append((i + 1) * seq_len)
        return torch.tensor(offsets, dtype=torch.int32)

    def sample(self, batch_size: int, seq_len: int, rng: np.random.Generator, pack: bool = False):
        """A batch of random training windows drawn with ``rng``: inputs and targets [batch_size, seq_len],
        and with ``pack`` their ``packed`` offsets (else None)."""
        starts = rng.integers(0, len(self.train) - seq_len, size=batch_size)
        x, y = self.windows("train", starts, seq_len)
        return x, y, (self.packed("train", starts, seq_len) if pack else None)

    def identity(self) -> dict:
        """What a resumed run checks it trains on: the name, and each split's length and content hash, and
        where the split has them, its document boundaries' count and hash (packing resets there)."""
        out = {"name": self.name}
        for split in ("train", "val"):
            tokens = getattr(self, split)
            digest = hashlib.blake2b(digest_size=16)
            step = max(1, (64 << 20) // max(1, tokens.itemsize))
            for i in range(0, len(tokens), step):
                digest.update(np.ascontiguousarray(tokens[i:i + step]).tobytes())
            out[split] = {"tokens": len(tokens), "blake2b": digest.hexdigest()}
            docs = getattr(self, f"{split}_docs")
            if docs is not None:
                starts = np.ascontiguousarray(docs, dtype=np.int64).tobytes()
                out[split].update(documents=len(docs), documents_blake2b=hashlib.blake2b(starts, digest_size=16)
                                  .hexdigest())
        return out

    def val_starts(self, seq_len: int, count: int) -> np.ndarray:
        """``count`` fixed window starts spread evenly over the validation split."""
        return np.linspace(0, len(self.val) - seq_len - 1, count).round().astype(np.int64)


def _walk(root: Path, keep_dir, keep_file) -> list[Path]:
    """The files under ``root`` whose names ``keep_file`` accepts, in folders ``keep_dir(path)`` accepts
    (a folder refused is not entered)."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if keep_dir(here / d)]
        files += [here / f for f in filenames if keep_file(f)]
    return files


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's .py files, sorted by path relative to ``root``; no site-packages."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = _walk(root, lambda d: d.name not in ("site-packages", "dist-packages", "__pycache__"),
                  lambda f: f.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _build_stdlib(root: Path, out: Path) -> dict:
    files = stdlib_files(root)
    if not files:
        raise FileNotFoundError(f"no .py files found under the standard library folder {root}")
    sizes = {"train": 0, "val": 0}
    counts = {"train": 0, "val": 0}
    starts = {"train": [], "val": []}
    with open(out / "train.bin", "wb") as train, open(out / "val.bin", "wb") as val:
        for i, f in enumerate(files):
            split = "val" if i % VAL_EVERY == VAL_EVERY - 1 else "train"
            data = f.read_bytes()
            (val if split == "val" else train).write(data)
            starts[split].append(sizes[split])
            sizes[split] += len(data)
            counts[split] += 1
    for split in ("train", "val"):
        np.save(out / f"{split}.docs.npy", document_starts(starts[split]))
    meta = {"python": sys.version, "stdlib": str(root), "files": counts, "bytes": sizes}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def _stdlib_folder(cache=None) -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    key = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    version = ".".join(map(str, sys.version_info[:3]))
    # stdlib2: the cache also holds where each file starts (train.docs.npy, val.docs.npy)
    return Path(cache or cache_dir()) / f"stdlib2-{platform.python_implementation().lower()}{version}-{key}"


def stdlib_cached(cache: str | Path | None = None) -> bool:
    """Whether ``stdlib_corpus(cache)`` finds its corpus built (else its first call builds it)."""
    return (_stdlib_folder(cache) / "meta.json").is_file()


def stdlib_corpus(cache: str | Path | None = None) -> TokenData:
    """Byte-level text of this interpreter's standard library (.py files), built once and cached.

    Files are taken in sorted path order; every 100th is validation text. The cache is keyed by the
    Python implementation, version and standard library location.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    folder = _stdlib_folder(cache)
    if not stdlib_cached(cache):
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".stdlib-", dir=folder.parent))
        try:
            _build_stdlib(root, tmp)
            try:
                os.rename(tmp, folder)
            except OSError:
                # Another process (a DDP rank) finished the same build first.
                if not (folder / "meta.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    train, val = (np.memmap(folder / f"{s}.bin", dtype=np.uint8, mode="r") for s in ("train", "val"))
    docs = [np.load(folder / f"{s}.docs.npy") for s in ("train", "val")]
    version = ".".join(map(str, sys.version_info[:3]))
    return TokenData(f"python {version} stdlib", train, val, vocab_size=256, bytes_per_token=1.0,
                     train_docs=docs[0], val_docs=docs[1])


def document_starts(starts) -> np.ndarray:
    """Sorted unique int64 document starts with 0 first (an empty document starts where the next does)."""
    return np.unique(np.concatenate([[0], np.asarray(starts, dtype=np.int64)])).astype(np.int64)


def _tail_cut(n: int, val_fraction: float) -> int:
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction!r}")
    return n - max(1, int(n * val_fraction))


def _tail_split(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    cut = _tail_cut(len(tokens), val_fraction)
    return tokens[:cut], tokens[cut:]


def _existing(path) -> Path:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data path not found: {path}")
    return path.resolve()


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is a samu training run's folder (it holds the run marker)."""
    return (folder / RUN_MARKER).exists()


def _text_files(root: Path) -> list[Path]:
    """Every non-hidden file under ``root``, sorted, never inside a samu run folder."""
    files = _walk(root, lambda d: not d.name.startswith(".") and not is_run_folder(d),
                  lambda f: not f.startswith("."))
    return sorted(p for p in files if p.is_file())


def text_corpus(path, val_fraction: float = 0.01) -> TokenData:
    """Byte-level text from a file, or from every non-hidden file under a folder (sorted paths;
    samu run folders inside it are never read). The last ``val_fraction`` of the bytes is validation
    text. The name is the absolute path. Each file of a folder is a document (a single file is none)."""
    path = _existing(path)
    if path.is_file():
        if path.stat().st_size and not _looks_like_text(path):
            warnings.warn(f"data file {path} does not look like text (its start is not printable UTF-8); it is read "
                          f"as bytes: if it holds token ids, give its data format (uint16 or uint32, --data-format)",
                          stacklevel=2)
        tokens = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
        train, val = _tail_split(tokens, val_fraction)
        return TokenData(str(path), train, val, vocab_size=256, bytes_per_token=1.0)
    if is_run_folder(path):
        raise ValueError(f"data folder {path} is a samu run folder, not text")
    files = _text_files(path)
    if not files:
        raise ValueError(f"data folder {path} holds no files")
    texts = [f.read_bytes() for f in files]
    tokens = np.frombuffer(b"".join(texts), dtype=np.uint8)
    starts = np.cumsum([0] + [len(t) for t in texts[:-1]])
    cut = _tail_cut(len(tokens), val_fraction)
    return TokenData(str(path), tokens[:cut], tokens[cut:], vocab_size=256, bytes_per_token=1.0,
                     train_docs=document_starts(starts[starts < cut]),
                     val_docs=document_starts(starts[starts >= cut] - cut))


def _looks_like_text(path: Path) -> bool:
    """Whether the file's first 64 KiB are printable UTF-8 (token ids almost never are)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # a character cut at the end of the window is still text
            return False
        text = head[:e.start].decode("utf-8")
    printable = sum(c.isprintable() or c in "\n\r\t" for c in text)
    return len(text) > 0 and printable >= 0.98 * len(text)


def token_file(path, dtype: str = "uint16", val_fraction: float = 0.01) -> TokenData:
    """Pre-tokenized data: a flat binary file of ``uint16`` or ``uint32`` token ids (native byte order).

    The vocabulary size is taken as the largest token + 1; the last ``val_fraction`` is validation.
    """
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype must be one of {', '.join(TOKEN_DTYPES)}, got {dtype!r}")
    path = _existing(path)
    if not path.is_file():
        raise ValueError(f"token file {path} is not a file")
    itemsize = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    size = path.stat().st_size
    if size == 0 or size % itemsize:
        raise ValueError(f"token file {path} has {size} bytes, not a positive multiple of {itemsize} ({dtype})")
    with open(path, "rb") as f:
        bom = f.read(2)
    if _looks_like_text(path) or bom in (b"\xff\xfe", b"\xfe\xff"):
        raise ValueError(f"token file {path} looks like text (its start is printable UTF-8 or a UTF-16 byte-order "
                         f"mark), not {dtype} token ids; train on text with data_format='text'")
    tokens = np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")
    top = int(tokens.max())
    if top >= MAX_VOCAB:
        raise ValueError(f"token file {path} holds token id {top} (first id >= {MAX_VOCAB} at position "
                         f"{_first_at_least(tokens, MAX_VOCAB)}): a vocabulary of {top + 1} is implausible; is the "
                         f"file {dtype} token ids?")
    head = np.asarray(tokens[:1 << 16])
    if dtype == "uint16" and len(head) >= 64 and not head[1::2].any() and head[0::2].any():
        raise ValueError(f"token file {path}: every second uint16 id is 0, as when a little-endian uint32 file is "
                         f"read as uint16; is it uint32 token ids?")
    train, val = _tail_split(tokens, val_fraction)
    return TokenData(str(path), train, val, vocab_size=top + 1)


def _first_at_least(tokens: np.ndarray, bound: int, step: int = 1 << 24) -> int:
    """Index of the first token >= ``bound`` (scanned in slices: no file-sized temporary)."""
    for i in range(0, len(tokens), step):
        hits = np.flatnonzero(np.asarray(tokens[i:i + step]) >= bound)
        if len(hits):
            return i + int(hits[0])
    return -1


DATA_FORMATS = ("text",) + tuple(TOKEN_DTYPES)


def load_data(source: str = "stdlib", data_format: str = "text") -> TokenData:
    """``source``: "stdlib" (the embedded corpus) or a path; ``data_format``: "text", "uint16" or "uint32"."""
    if data_format not in DATA_FORMATS:
        raise ValueError(f"data format must be one of {', '.join(DATA_FORMATS)}, got {data_format!r}")
    if source == "stdlib":
        if data_format != "text":
            raise ValueError("the embedded stdlib corpus is byte-level text (data format 'text')")
        return stdlib_corpus()
    if data_format == "text":
        return text_corpus(source)
    return token_file(source, data_format)
