"""Training data: byte tokenizer, text corpus, fixed-window dataset and the global-batch sampler.

- Tokens are bytes (vocab 256): `encode` / `decode`, no vocabulary file. A job's tokenizer,
  JSONL and Parquet corpora, packing and the token cache are `corpora`'s and `documents`';
  whatever made the tokens, the dataset and the sampler below are these.
- A corpus is the bytes of the files a user names. A named file is read whatever its name; a
  named directory contributes, recursively, its files whose suffix is in `TEXT_SUFFIXES` (or the
  suffixes the caller gives), skipping hidden entries and `site-packages` / `dist-packages`, in
  sorted path order (path components compared as strings), without following symbolic links to
  directories. Paths are taken in the order given and their bytes concatenated; `max_bytes`
  stops reading once that many bytes are in (the last file is cut). The default demo corpus is
  the Python standard library's own `*.py` sources.
- Sample i is the window of seq_len + 1 tokens starting at token i * seq_len: inputs are its
  first seq_len tokens, targets the last seq_len (shifted by one).
- `Sampler` decides which samples form each step's global batch: a stream of per-epoch
  permutations (numpy PCG64 seeded with (seed, epoch)) cut into consecutive global batches, so a
  step's samples depend on (num_samples, global batch size, seed, step) only. `Sampler.split`
  hands out contiguous micro-batches of that batch to pipelines; however the batch is split, the
  same step trains on the same samples in the same order.

Errors (user input; messages name the path or field and what to change):

    DataError (ValueError)
    ├── CorpusError   missing path, empty corpus, corpus shorter than one sample
    └── BatchError    sampler sizes out of range, micro-batches that do not fill the batch
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

VOCAB_SIZE = 256
TEXT_SUFFIXES = frozenset(
    {".py", ".pyi", ".txt", ".md", ".rst", ".c", ".h", ".cc", ".cpp", ".rs", ".go", ".js", ".ts"}
    | {".java", ".sh", ".toml", ".yaml", ".yml", ".json", ".cfg", ".ini", ".html", ".css"}
)
# Directories never descended into: installed third-party code is not "the standard library".
SKIPPED_DIRECTORIES = frozenset({"site-packages", "dist-packages", "__pycache__"})

# Token ids: bytes (uint8) here; a tokenizer's ids (uint16/uint32, memory-mapped) in `corpora`.
Tokens = npt.NDArray[np.unsignedinteger[Any]]


class DataError(ValueError):
    """Base of the data errors; all are user input errors."""


class CorpusError(DataError):
    """A corpus path that does not exist, or a corpus with too little text."""


class BatchError(DataError):
    """Batch sizes that are out of range or do not add up to the global batch."""


# --- tokenizer ----------------------------------------------------------------------------------


def encode(data: bytes | str) -> Tokens:
    """Token ids of `data`: its bytes (str is UTF-8 encoded first)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return np.frombuffer(raw, dtype=np.uint8).copy()


def decode(ids: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor) -> str:
    """Text of token ids; byte sequences that are not UTF-8 become U+FFFD."""
    values = ids.tolist() if isinstance(ids, np.ndarray | torch.Tensor) else list(ids)
    return bytes(values).decode("utf-8", errors="replace")


# --- corpus -------------------------------------------------------------------------------------


def default_corpus_root() -> Path:
    """The standard library source tree of the running Python (the demo corpus)."""
    return Path(sysconfig.get_paths()["stdlib"])


def load_default_corpus(max_bytes: int | None = None) -> Tokens:
    """Tokens of the standard library's *.py files, at most `max_bytes` of them."""
    return load_corpus([default_corpus_root()], max_bytes=max_bytes, suffixes=frozenset({".py"}))


def load_corpus(
    paths: Sequence[str | os.PathLike[str]],
    *,
    max_bytes: int | None = None,
    suffixes: frozenset[str] = TEXT_SUFFIXES,
) -> Tokens:
    """Tokens of the files under `paths` (see the module docstring for which, in what order).

    Raises CorpusError when a path does not exist or cannot be read, when `paths` is empty,
    when no bytes are found, or when max_bytes < 1.
    """
    if not paths:
        raise CorpusError("no corpus paths given; name at least one file or directory")
    if max_bytes is not None and max_bytes < 1:
        raise CorpusError(f"max corpus bytes must be >= 1 (got {max_bytes}); raise it or omit it")
    roots = [Path(path) for path in paths]
    for root in roots:
        if not root.exists():
            raise CorpusError(f"corpus path {str(root)!r} does not exist; name a file or directory")
    chunks = _read_until(_files(roots, suffixes), max_bytes)
    if not chunks:
        listed = ", ".join(repr(str(root)) for root in roots)
        kinds = " ".join(sorted(suffixes))
        raise CorpusError(
            f"corpus {listed} is empty: no non-empty files (directories are searched for "
            f"{kinds}); name files or directories that hold text"
        )
    return encode(b"".join(chunks))


def corpus_files(root: Path, suffixes: frozenset[str] = TEXT_SUFFIXES) -> Iterator[Path]:
    """Files of one corpus root, lazily, in sorted path order (a file root is itself)."""
    if not root.is_dir():
        yield root
        return
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name.startswith(".") or entry.name in SKIPPED_DIRECTORIES:
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from corpus_files(Path(entry.path), suffixes)
        elif entry.is_file() and Path(entry.name).suffix in suffixes:
            yield Path(entry.path)


def _files(roots: Sequence[Path], suffixes: frozenset[str]) -> Iterator[Path]:
    for root in roots:
        yield from corpus_files(root, suffixes)


def _read_until(files: Iterator[Path], max_bytes: int | None) -> list[bytes]:
    """Contents of `files` in order, stopping once `max_bytes` are read (None: read all)."""
    chunks: list[bytes] = []
    remaining = max_bytes
    for path in files:
        try:
            with path.open("rb") as handle:
                chunk = handle.read() if remaining is None else handle.read(remaining)
        except OSError as exc:
            raise CorpusError(
                f"cannot read corpus file {str(path)!r} ({exc.strerror}); fix its permissions "
                "or leave it out"
            ) from exc
        if chunk:
            chunks.append(chunk)
        if remaining is not None:
            remaining -= len(chunk)
            if remaining <= 0:
                break
    return chunks


# --- dataset ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TokenDataset:
    """Fixed windows over a token array: sample i covers tokens [i*T, i*T + T] (T = seq_len)."""

    tokens: Tokens
    seq_len: int

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise CorpusError(f"seq_len must be >= 1 (got {self.seq_len})")
        if len(self.tokens) < self.seq_len + 1:
            raise CorpusError(
                f"the corpus has {len(self.tokens)} tokens but one sample of seq_len "
                f"{self.seq_len} needs {self.seq_len + 1}; give a larger corpus"
            )

    @property
    def num_samples(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 [len(indices), seq_len], of the given samples."""
        samples = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(samples) and (samples.min() < 0 or samples.max() >= self.num_samples):
            raise IndexError(f"sample indices must lie in 0..{self.num_samples - 1}")
        starts = samples * self.seq_len
        offsets = np.arange(self.seq_len + 1, dtype=np.int64)
        windows = torch.from_numpy(self.tokens[starts[:, None] + offsets[None, :]].astype(np.int64))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


# --- sampler ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampler:
    """Which samples each training step uses, identical in every process and every plan.

    The sample stream is permutation(epoch 0) + permutation(epoch 1) + ..., each drawn from
    numpy's PCG64 seeded with (seed, epoch); step s takes stream positions [s*B, (s+1)*B), so a
    global batch may cross an epoch boundary and every sample appears once per epoch.
    """

    num_samples: int
    global_batch_size: int
    seed: int

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise BatchError(f"num_samples must be >= 1 (got {self.num_samples})")
        if self.global_batch_size < 1:
            raise BatchError(f"global batch size must be >= 1 (got {self.global_batch_size})")
        if self.seed < 0:
            raise BatchError(f"seed must be >= 0 (got {self.seed})")

    def permutation(self, epoch: int) -> npt.NDArray[np.int64]:
        """The order of all samples in data epoch `epoch`."""
        generator = np.random.Generator(np.random.PCG64([self.seed, epoch]))
        return generator.permutation(self.num_samples).astype(np.int64)

    def global_batch(self, step: int) -> tuple[int, ...]:
        """Sample indices of step `step`'s global batch, in order."""
        if step < 0:
            raise BatchError(f"step must be >= 0 (got {step})")
        start = step * self.global_batch_size
        stop = start + self.global_batch_size
        first, last = start // self.num_samples, (stop - 1) // self.num_samples
        stream = np.concatenate([self.permutation(e) for e in range(first, last + 1)])
        offset = first * self.num_samples
        return tuple(int(i) for i in stream[start - offset : stop - offset])

    def split(
        self, step: int, micro_batch_size: int, micro_batches_per_pipeline: Sequence[int]
    ) -> list[list[tuple[int, ...]]]:
        """Step `step`'s micro-batches, per pipeline in pipeline order.

        Global micro-batch g holds positions [g*b, (g+1)*b) of the global batch; pipeline p
        gets the next `micro_batches_per_pipeline[p]` of them. Raises BatchError unless
        b >= 1, every count >= 0 and sum(counts) * b equals the global batch size.
        """
        self._check_split(micro_batch_size, micro_batches_per_pipeline)
        batch = self.global_batch(step)
        b = micro_batch_size
        result: list[list[tuple[int, ...]]] = []
        g = 0
        for count in micro_batches_per_pipeline:
            result.append([batch[(g + m) * b : (g + m + 1) * b] for m in range(count)])
            g += count
        return result

    def _check_split(self, micro_batch_size: int, counts: Sequence[int]) -> None:
        if micro_batch_size < 1:
            raise BatchError(f"micro-batch size must be >= 1 (got {micro_batch_size})")
        if any(count < 0 for count in counts):
            raise BatchError(f"micro-batch counts must be >= 0 (got {list(counts)})")
        if self.global_batch_size % micro_batch_size:
            raise BatchError(
                f"global batch size {self.global_batch_size} is not a multiple of the micro-batch "
                f"size {micro_batch_size}; choose a micro-batch size that divides it"
            )
        covered = sum(counts) * micro_batch_size
        if covered != self.global_batch_size:
            raise BatchError(
                f"{sum(counts)} micro-batches (per pipeline {list(counts)}) of {micro_batch_size} "
                f"samples cover {covered} samples but the global batch is "
                f"{self.global_batch_size}; make the counts sum to "
                f"{self.global_batch_size // micro_batch_size}"
            )
