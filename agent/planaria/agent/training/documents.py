"""Documents of a corpus: the texts a tokenizer sees, one by one, from text, JSONL or Parquet
(`messages.DataFormat`).

- `DataFormat.TEXT`: every file is one document (its bytes). Directories contribute their files
  whose suffix is in `data.TEXT_SUFFIXES`, in `data.corpus_files` order.
- `DataFormat.JSONL`: one JSON object per line; a document is the string under `text_field`.
  Blank lines are skipped; a line that is not a JSON object, or whose field is missing or not
  a string, is an error naming the file, the line and the fix. Directories contribute
  `*.jsonl` files.
- `DataFormat.PARQUET`: a document is one non-null string of the column `text_field`, row by row
  and row group by row group. Directories contribute `*.parquet` files. pyarrow is imported
  only here and only for this format (the `planaria[hf]` extra).

`max_bytes` caps the UTF-8 bytes of document text read, over all files in order: the document
that crosses the cap is cut there (bytes; a cut character is decoded as U+FFFD by the
tokenizer), the rest are not read. Not here: tokenising and packing (`corpora`).

Errors: `DocumentError` (a `data.CorpusError`, so an agent latches it as INVALID_DATA) and
`MissingExtraError`; both name the file or field and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from planaria.agent.training import data
from planaria.wire import messages

EXTRA = "install planaria[hf] (pip install 'planaria[hf]')"


SUFFIXES = {
    messages.DataFormat.TEXT: data.TEXT_SUFFIXES,
    messages.DataFormat.JSONL: frozenset({".jsonl"}),
    messages.DataFormat.PARQUET: frozenset({".parquet"}),
}


class DocumentError(data.CorpusError):
    """A corpus file that does not hold documents of its format (a bad line, a missing field)."""


class MissingExtraError(data.CorpusError):
    """The job needs a library of the `planaria[hf]` extra that is not installed."""


def files(paths: Sequence[str], fmt: messages.DataFormat) -> list[Path]:
    """The corpus files under `paths` for `fmt`, in order; CorpusError for a missing path."""
    if not paths:
        raise data.CorpusError("no corpus paths given; name at least one file or directory")
    roots = [Path(path) for path in paths]
    for root in roots:
        if not root.exists():
            raise data.CorpusError(
                f"corpus path {str(root)!r} does not exist; name a file or directory"
            )
    return [f for root in roots for f in data.corpus_files(root, SUFFIXES[fmt])]


def read(
    paths: Sequence[Path], fmt: messages.DataFormat, text_field: str, max_bytes: int | None
) -> Iterator[bytes]:
    """The UTF-8 bytes of every document of `paths`, in order, capped at `max_bytes` in all."""
    remaining = max_bytes
    for path in paths:
        for text in _documents(path, fmt, text_field):
            if remaining is not None:
                text = text[:remaining]
                remaining -= len(text)
            yield text
            if remaining is not None and remaining <= 0:
                return


def _documents(path: Path, fmt: messages.DataFormat, field: str) -> Iterator[bytes]:
    if fmt is messages.DataFormat.JSONL:
        return _jsonl(path, field)
    if fmt is messages.DataFormat.PARQUET:
        return _parquet(path, field)
    return iter([_read_bytes(path)])


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise data.CorpusError(
            f"cannot read corpus file {str(path)!r} ({exc.strerror}); fix its permissions or "
            "leave it out"
        ) from exc


def _jsonl(path: Path, field: str) -> Iterator[bytes]:
    for number, line in enumerate(_read_bytes(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {number} of {str(path)!r}"
        try:
            record: Any = json.loads(line)
        except ValueError as exc:
            raise DocumentError(
                f"{where} is not JSON ({exc}); give one JSON object per line (data.format jsonl)"
            ) from None
        if not isinstance(record, dict):
            raise DocumentError(f"{where} is not a JSON object; give one object per line")
        if field not in record:
            known = ", ".join(sorted(record)) or "none"
            raise DocumentError(
                f"data.textField {field!r} is not a field of {where} (its fields: {known}); "
                "name the field that holds the text"
            )
        if not isinstance(record[field], str):
            raise DocumentError(
                f"data.textField {field!r} of {where} is not a string; name a field that holds text"
            )
        yield record[field].encode("utf-8")


def _parquet(path: Path, column: str) -> Iterator[bytes]:
    parquet = import_pyarrow_parquet()
    try:
        table = parquet.ParquetFile(path)
    except Exception as exc:  # pyarrow's own error types: any means "not a Parquet file"
        raise DocumentError(
            f"corpus file {str(path)!r} is not a Parquet file ({exc}); give Parquet files "
            "or change data.format"
        ) from None
    names = table.schema_arrow.names
    if column not in names:
        raise DocumentError(
            f"data.textField {column!r} is not a column of {str(path)!r} (its columns: "
            f"{', '.join(names)}); name the column that holds the text"
        )
    kind = table.schema_arrow.field(column).type
    if str(kind) not in ("string", "large_string"):
        raise DocumentError(
            f"data.textField {column!r} of {str(path)!r} is a {kind} column; name a string column"
        )
    for batch in table.iter_batches(columns=[column]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text.encode("utf-8")


def import_pyarrow_parquet() -> Any:
    """pyarrow.parquet, or MissingExtraError saying how to install it."""
    try:
        import pyarrow.parquet  # the planaria[hf] extra: only Parquet corpora need it
    except ImportError:
        raise MissingExtraError(f"data.format parquet needs pyarrow; {EXTRA}") from None
    return pyarrow.parquet
