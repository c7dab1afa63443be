"""The job's corpus as token ids: documents tokenised once, packed, cached and memory-mapped.

    corpus = corpora.load(settings.data)      # Corpus(tokens, vocab_size), every worker alike

- Plain text with byte tokens and no separator (the default) is today's corpus: the files'
  bytes concatenated (`data.load_corpus`), nothing cached.
- Otherwise (`DataSettings.needs_tokenising`) every document (`documents`) is tokenised, by the
  `tokenizer.json` of `tokenizer_path` (Hugging Face `tokenizers`, from the `planaria[hf]`
  extra) or as its UTF-8 bytes, and the corpus is packed: document 1's tokens, the separator's
  token, document 2's tokens, the separator's token, ... (no separator when it is ""); no
  padding, nothing dropped. `data.TokenDataset` then cuts the stream into samples of seq_len+1
  tokens starting every seq_len tokens, across document boundaries (as GPT-2 trained), and
  drops the tail shorter than one sample.
- The packed stream is written once into `cache_dir` (default `default_cache_dir`) as
  `<key>/tokens.bin` (bytes as uint8; a tokenizer's ids as little-endian uint16, or uint32 for
  vocabularies above 65536) with
  `<key>/meta.json`, and memory-mapped read-only after. The key is a SHA-256 over everything the
  tokens depend on: the format, text field, separator, byte cap, the tokenizer file's content
  hash, and every corpus file's path and content hash, so an edited file or tokenizer gives a
  new key and a stale cache is never read. The entry is built in a private folder and renamed
  into place: workers racing on one cache folder each build an identical entry, one rename
  wins and nobody reads a half-written file.
- With a tokenizer, the model's vocabulary is the tokenizer's (`Corpus.vocab_size`, added
  tokens included); byte tokens keep the model shape's (every shape has at least 256).

Errors: `data.CorpusError` and its subclasses (`documents.DocumentError`,
`documents.MissingExtraError`, `TokenizerError`), each naming the field or file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from planaria.agent.training import data, documents
from planaria.wire import messages

CACHE_VERSION = 1  # bump when the packing or the file layout changes
TOKENS_FILE, META_FILE = "tokens.bin", "meta.json"
BATCH_DOCUMENTS = 1024  # documents per tokenizer call (its batch API runs them in parallel)
MAX_UINT16_VOCAB = 1 << 16


class TokenizerError(data.CorpusError):
    """A tokenizer file that cannot be read or parsed, or a separator it does not know."""


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Corpus:
    """Token ids of a whole corpus and the vocabulary they come from (None: bytes, which any
    model shape's vocabulary covers)."""

    tokens: data.Tokens
    vocab_size: int | None


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/planaria/tokens`, or `~/.cache/planaria/tokens`."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "planaria" / "tokens"


def load(settings: messages.DataSettings) -> Corpus:
    """The corpus of `settings`: bytes as today, or tokenised through the cache."""
    if not settings.needs_tokenising:
        return Corpus(
            tokens=data.load_corpus(settings.corpus_paths, max_bytes=settings.max_bytes),
            vocab_size=None,
        )
    tokenizer = Tokenizer.open(settings.tokenizer_path) if settings.tokenizer_path else None
    files = documents.files(settings.corpus_paths, settings.format)
    folder = Path(settings.cache_dir) if settings.cache_dir else default_cache_dir(os.environ)
    entry = folder / cache_key(settings, files, tokenizer)
    vocab = None if tokenizer is None else tokenizer.vocab_size
    if not (entry / META_FILE).exists():
        _build(entry, settings, files, tokenizer)
    return Corpus(tokens=_map(entry), vocab_size=vocab)


# --- tokenizer ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Tokenizer:
    """A `tokenizers.Tokenizer` read from a tokenizer.json, with its file's content hash."""

    path: Path
    digest: str
    vocab_size: int
    inner: Any  # tokenizers.Tokenizer (the extra's type; not imported at module level)

    @classmethod
    def open(cls, path: str) -> Tokenizer:
        """The tokenizer of `path`; MissingExtraError without the library, TokenizerError when
        the file cannot be read or parsed."""
        try:
            import tokenizers  # the planaria[hf] extra: only jobs with a tokenizer need it
        except ImportError:
            raise documents.MissingExtraError(
                f"data.tokenizer needs the tokenizers library; {documents.EXTRA}"
            ) from None
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise TokenizerError(
                f"data.tokenizer {path!r} cannot be read ({exc.strerror}); give the path of a "
                "tokenizer.json"
            ) from None
        try:
            inner = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # the library raises bare Exceptions for a bad file
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TokenizerError(
                f"data.tokenizer {path!r} is not a tokenizer.json ({reason}); give a file "
                "saved by the tokenizers library (Tokenizer.save)"
            ) from None
        size = int(inner.get_vocab_size(with_added_tokens=True))
        digest = hashlib.sha256(raw).hexdigest()
        return cls(path=Path(path), digest=digest, vocab_size=size, inner=inner)

    def token(self, text: str) -> int:
        """The id of the single token `text` (a separator); TokenizerError if there is none."""
        ident = self.inner.token_to_id(text)
        if ident is None:
            raise TokenizerError(
                f"data.separator {text!r} is not a token of data.tokenizer {str(self.path)!r}; "
                "give one of its tokens (an end-of-text token such as '</s>')"
            )
        return int(ident)

    def encode(self, texts: list[bytes]) -> list[list[int]]:
        decoded = [t.decode("utf-8", errors="replace") for t in texts]
        return [list(e.ids) for e in self.inner.encode_batch(decoded, add_special_tokens=False)]


# --- cache --------------------------------------------------------------------------------------


def cache_key(
    settings: messages.DataSettings, files: Iterable[Path], tokenizer: Tokenizer | None
) -> str:
    """SHA-256 (hex) of everything the packed tokens depend on (module docstring)."""
    described = {
        "version": CACHE_VERSION,
        "format": settings.format.value,
        "text_field": settings.text_field if settings.format is not _TEXT else "",
        "separator": settings.separator,
        "max_bytes": settings.max_bytes,
        "tokenizer": "bytes" if tokenizer is None else tokenizer.digest,
        "files": [[str(path.resolve()), _file_digest(path)] for path in files],
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


_TEXT = messages.DataFormat.TEXT


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise data.CorpusError(
            f"cannot read corpus file {str(path)!r} ({exc.strerror}); fix its permissions or "
            "leave it out"
        ) from exc
    return digest.hexdigest()


def _dtype(tokenizer: Tokenizer | None) -> np.dtype[Any]:
    """The narrowest unsigned type of the vocabulary: bytes, 16 or 32 bits."""
    if tokenizer is None:
        return np.dtype("u1")
    return np.dtype("<u2") if tokenizer.vocab_size <= MAX_UINT16_VOCAB else np.dtype("<u4")


def _build(
    entry: Path, settings: messages.DataSettings, files: list[Path], tokenizer: Tokenizer | None
) -> None:
    """Tokenise, pack and write the cache entry `entry` (atomically: see the module docstring)."""
    dtype = _dtype(tokenizer)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        private = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    except OSError as exc:
        raise data.CorpusError(
            f"data.cacheDir {str(entry.parent)!r} cannot be written ({exc.strerror}); give a "
            "folder this worker can write"
        ) from None
    try:
        count = 0
        with (private / TOKENS_FILE).open("wb") as out:
            for chunk in packed(settings, files, tokenizer):
                out.write(chunk.astype(dtype, copy=False).tobytes())
                count += len(chunk)
        if count == 0:
            listed = ", ".join(repr(p) for p in settings.corpus_paths)
            raise data.CorpusError(
                f"corpus {listed} is empty: no {settings.format.value} documents with text; "
                "name files or directories that hold text"
            )
        meta = {"dtype": dtype.str, "num_tokens": count, "files": [str(p) for p in files]}
        (private / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        private.chmod(0o755)  # mkdtemp made it private; the cache is for every reader
        _publish(private, entry)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _publish(private: Path, entry: Path) -> None:
    try:
        private.rename(entry)
    except OSError:
        if not (entry / META_FILE).exists():  # not a lost race: a real failure
            raise


def packed(
    settings: messages.DataSettings, files: list[Path], tokenizer: Tokenizer | None
) -> Iterator[npt.NDArray[np.int64]]:
    """The packed token stream in chunks: each document's tokens, then the separator's."""
    separator = np.asarray(_separator(settings.separator, tokenizer), dtype=np.int64)
    texts = documents.read(files, settings.format, settings.text_field, settings.max_bytes)
    for batch in _batched(texts, BATCH_DOCUMENTS):
        if tokenizer is None:
            encoded = [np.frombuffer(text, dtype=np.uint8) for text in batch]
        else:
            encoded = [np.asarray(ids, dtype=np.int64) for ids in tokenizer.encode(batch)]
        yield np.concatenate([part for ids in encoded for part in (ids, separator)]).astype(
            np.int64, copy=False
        )


def _separator(text: str, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    if not text:
        return ()
    if tokenizer is None:
        return tuple(text.encode("utf-8"))
    return (tokenizer.token(text),)


def _batched(items: Iterator[bytes], size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _map(entry: Path) -> data.Tokens:
    """The cached tokens of `entry`, memory-mapped read-only."""
    meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
    dtype, count = np.dtype(meta["dtype"]), int(meta["num_tokens"])
    path = entry / TOKENS_FILE
    if path.stat().st_size != count * dtype.itemsize:
        raise data.CorpusError(
            f"token cache {str(entry)!r} is damaged ({path.stat().st_size} bytes, expected "
            f"{count * dtype.itemsize}); delete that folder and run again"
        )
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
