"""Test data of the `planaria[hf]` extra: a tokenizer trained here, JSONL and Parquet corpora.

`train_tokenizer` trains a byte-level BPE tokenizer (the `tokenizers` library) on some of the
standard library's sources, with `</s>` as its one special token, and saves it as a
tokenizer.json; `stdlib_documents` are those sources as documents; `write_jsonl` and
`write_parquet` write documents the way a user's dataset holds them (with an extra field or
column beside the text). Nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from planaria.agent.training import data

EOS = "</s>"


def stdlib_documents(count: int, max_chars: int = 4000) -> list[str]:
    """The first `count` of the standard library's top-level *.py files (sorted by name), each
    cut to `max_chars` characters."""
    root = data.default_corpus_root()
    files = sorted(root.glob("*.py"))[:count]
    return [f.read_text(encoding="utf-8", errors="replace")[:max_chars] for f in files]


def train_tokenizer(path: Path, vocab_size: int = 384, documents: int = 30) -> Tokenizer:
    """A byte-level BPE tokenizer of `vocab_size` tokens (`EOS` included) trained on
    `stdlib_documents(documents)`, saved at `path`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(stdlib_documents(documents), trainer)
    tokenizer.save(str(path))
    return tokenizer


def write_jsonl(path: Path, documents: Sequence[str], field: str = "text") -> Path:
    """One JSON object per document: {"id": i, field: text}."""
    lines = [json.dumps({"id": i, field: text}) for i, text in enumerate(documents)]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_parquet(
    path: Path, documents: Sequence[str | None], column: str = "text", row_group_size: int = 3
) -> Path:
    """A table of (id, column) rows, several row groups."""
    table = pa.table({"id": list(range(len(documents))), column: list(documents)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path
