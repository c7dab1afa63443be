"""A job's corpus as tokens (planaria.agent.training.corpora and .documents).

Covers: plain byte text is today's corpus (nothing cached); JSONL and Parquet documents packed
with the separator after each, against per-document encoding by the tokenizer trained here
(Parquet's null rows skipped, both formats giving the same stream); text files as documents;
packing keeps every byte of every document in order, with the byte cap (Hypothesis, against a
concatenation oracle) and with a tokenizer (Hypothesis, against per-document encoding); the
cache: reused (the same file, not rewritten), never stale (an edit that keeps a file's size
and mtime, another tokenizer, another separator or field each make a new entry), a damaged
entry refused; the model's vocabulary becomes the tokenizer's and the reference trains on it;
a memory-mapped corpus gives the same samples as the same tokens in memory; one-line errors
naming the field or file and the fix for every bad input, including a missing extra.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from planaria.agent.runtime import training_thread
from planaria.agent.training import corpora, data, documents, reference, semantics
from planaria.contract import shapes
from planaria.wire import messages
from tests import hf_data

JSONL, PARQUET, TEXT = (
    messages.DataFormat.JSONL,
    messages.DataFormat.PARQUET,
    messages.DataFormat.TEXT,
)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    hf_data.train_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_file: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_file))


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return hf_data.stdlib_documents(8, max_chars=1500)


def _settings(paths: list[Path], cache: Path, **changes: object) -> messages.DataSettings:
    values: dict[str, object] = {"corpus_paths": tuple(str(p) for p in paths)}
    values["cache_dir"] = str(cache)
    values.update(changes)
    return messages.DataSettings(**values)  # type: ignore[arg-type]


def _oracle(tokenizer: Tokenizer, docs: list[str]) -> list[int]:
    """Each document encoded on its own (no special tokens), then the separator `</s>`."""
    eos = tokenizer.token_to_id(hf_data.EOS)
    assert eos is not None
    out: list[int] = []
    for doc in docs:
        out += tokenizer.encode(doc, add_special_tokens=False).ids + [eos]
    return out


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


# --- what the tokens are ------------------------------------------------------------------------


def test_plain_byte_text_is_todays_corpus_and_nothing_is_cached(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello ")
    (tmp_path / "b.txt").write_text("world")
    settings_ = _settings([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "cache")
    corpus = corpora.load(settings_)
    assert corpus.vocab_size is None
    assert data.decode(corpus.tokens) == "hello world"
    assert np.array_equal(corpus.tokens, data.load_corpus(settings_.corpus_paths))
    assert not (tmp_path / "cache").exists()


def test_jsonl_documents_are_packed_with_the_separator_after_each(
    tmp_path: Path, tokenizer_file: Path, tokenizer: Tokenizer, docs: list[str]
) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    settings_ = _settings(
        [path],
        tmp_path / "cache",
        format=JSONL,
        tokenizer_path=str(tokenizer_file),
        separator=hf_data.EOS,
    )
    corpus = corpora.load(settings_)
    assert corpus.tokens.tolist() == _oracle(tokenizer, docs)
    assert corpus.vocab_size == tokenizer.get_vocab_size(with_added_tokens=True) == 384
    assert isinstance(corpus.tokens, np.memmap) and corpus.tokens.dtype == np.uint16


def test_parquet_gives_the_jsonl_stream_and_skips_null_rows(
    tmp_path: Path, tokenizer_file: Path, docs: list[str]
) -> None:
    jsonl = hf_data.write_jsonl(tmp_path / "train.jsonl", docs, field="body")
    with_nulls: list[str | None] = [*docs[:3], None, *docs[3:]]
    parquet = hf_data.write_parquet(tmp_path / "train.parquet", with_nulls, column="body")
    common = {"text_field": "body", "tokenizer_path": str(tokenizer_file), "separator": "</s>"}
    from_jsonl = corpora.load(_settings([jsonl], tmp_path / "c1", format=JSONL, **common))
    from_parquet = corpora.load(_settings([parquet], tmp_path / "c2", format=PARQUET, **common))
    assert np.array_equal(from_jsonl.tokens, from_parquet.tokens)


def test_text_files_are_documents_with_a_tokenizer(
    tmp_path: Path, tokenizer_file: Path, tokenizer: Tokenizer, docs: list[str]
) -> None:
    folder = tmp_path / "texts"
    folder.mkdir()
    for i, doc in enumerate(docs[:3]):
        (folder / f"{i}.txt").write_text(doc, encoding="utf-8")
    settings_ = _settings(
        [folder], tmp_path / "cache", tokenizer_path=str(tokenizer_file), separator="</s>"
    )
    assert corpora.load(settings_).tokens.tolist() == _oracle(tokenizer, docs[:3])


@settings(max_examples=40, deadline=None)
@given(
    texts=st.lists(st.text(max_size=30), max_size=6),
    separator=st.text(max_size=3),
    cap=st.none() | st.integers(min_value=1, max_value=120),
)
def test_packing_keeps_every_byte_of_every_document_in_order(
    texts: list[str], separator: str, cap: int | None
) -> None:
    want, left = b"", cap
    for text in texts:
        raw = text.encode("utf-8")
        if left is not None:
            raw, left = raw[:left], left - len(raw[:left])
        want += raw + separator.encode("utf-8")
        if left is not None and left <= 0:
            break
    with tempfile.TemporaryDirectory() as folder:
        path = hf_data.write_jsonl(Path(folder) / "d.jsonl", texts)
        settings_ = _settings(
            [path], Path(folder) / "cache", format=JSONL, separator=separator, max_bytes=cap
        )
        if not want:
            with pytest.raises(data.CorpusError, match="is empty"):
                corpora.load(settings_)
            return
        corpus = corpora.load(settings_)
    assert corpus.vocab_size is None and corpus.tokens.dtype == np.uint8
    assert bytes(corpus.tokens.tolist()) == want


@settings(max_examples=15, deadline=None)
@given(texts=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=5))
def test_a_tokenizer_packs_each_documents_own_encoding(
    tokenizer_file: Path, tokenizer: Tokenizer, texts: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = hf_data.write_jsonl(Path(folder) / "d.jsonl", texts)
        settings_ = _settings(
            [path],
            Path(folder) / "cache",
            format=JSONL,
            tokenizer_path=str(tokenizer_file),
            separator=hf_data.EOS,
        )
        assert corpora.load(settings_).tokens.tolist() == _oracle(tokenizer, texts)


# --- the cache ----------------------------------------------------------------------------------


def test_the_cache_is_reused_not_rewritten(
    tmp_path: Path, tokenizer_file: Path, docs: list[str]
) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    cache = tmp_path / "cache"
    settings_ = _settings([path], cache, format=JSONL, tokenizer_path=str(tokenizer_file))
    first = corpora.load(settings_)
    (entry,) = _entries(cache)
    written = os.stat(entry / corpora.TOKENS_FILE)
    second = corpora.load(settings_)
    again = os.stat(entry / corpora.TOKENS_FILE)
    assert _entries(cache) == [entry] and list(cache.iterdir()) == [entry]  # no leftovers
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert np.array_equal(first.tokens, second.tokens)
    meta = json.loads((entry / corpora.META_FILE).read_text())
    assert meta["num_tokens"] == len(first.tokens) and meta["files"] == [str(path)]


def _same_size_edit(path: Path) -> None:
    """Change one letter, keeping the file's size and modification time."""
    before = os.stat(path)
    text = path.read_text(encoding="utf-8")
    i = text.index("import")
    path.write_text(text[:i] + "IMPORT" + text[i + 6 :], encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_size == before.st_size


def test_a_stale_cache_is_never_used(tmp_path: Path, tokenizer_file: Path, docs: list[str]) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    cache = tmp_path / "cache"
    base = _settings([path], cache, format=JSONL, tokenizer_path=str(tokenizer_file))
    before = corpora.load(base).tokens.tolist()
    _same_size_edit(path)
    edited = corpora.load(base).tokens.tolist()
    assert edited != before and len(_entries(cache)) == 2
    other = tmp_path / "other.json"
    hf_data.train_tokenizer(other, vocab_size=320)
    variants: list[dict[str, object]] = [
        {"tokenizer_path": str(other)},
        {"separator": hf_data.EOS},
        {"max_bytes": 1000},
    ]
    for number, change in enumerate(variants, start=3):
        corpora.load(
            _settings(
                [path], cache, format=JSONL, **{**{"tokenizer_path": str(tokenizer_file)}, **change}
            )
        )
        assert len(_entries(cache)) == number, change
    assert corpora.load(base).tokens.tolist() == edited  # and the old entries are still right


def test_a_damaged_cache_entry_is_refused(tmp_path: Path, docs: list[str]) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    settings_ = _settings([path], tmp_path / "cache", format=JSONL)
    corpora.load(settings_)
    (entry,) = _entries(tmp_path / "cache")
    tokens = entry / corpora.TOKENS_FILE
    tokens.write_bytes(tokens.read_bytes()[:-1])
    with pytest.raises(data.CorpusError, match="is damaged .*; delete that folder"):
        corpora.load(settings_)


# --- training on it -----------------------------------------------------------------------------


def test_the_models_vocabulary_becomes_the_tokenizers(
    tmp_path: Path, tokenizer_file: Path, docs: list[str]
) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    data_ = _settings(
        [path],
        tmp_path / "cache",
        format=JSONL,
        tokenizer_path=str(tokenizer_file),
        separator=hf_data.EOS,
    )
    settings_ = messages.TrainingSettings(
        model="tiny",
        seed=1,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=2,
        data=data_,
        device=messages.Device.CPU,
        snapshot_interval_steps=0,
        redundancy=messages.RedundancyMode.NONE,
    )
    corpus = corpora.load(data_)
    config = training_thread.training_config(settings_, 1, corpus.vocab_size)
    assert config.shape.vocab_size == 384 and config.shape.d_model == 64
    assert int(corpus.tokens.max()) >= 256  # ids a byte vocabulary could not hold
    trainer = reference.ReferenceTrainer(config, corpus.tokens)
    assert np.isfinite(trainer.step(0))
    embedding = trainer.layer_state(0)
    tokens = embedding.parameters[embedding.names.index("tokens")]
    assert tuple(tokens.shape) == (384, 64)


def test_a_memory_mapped_corpus_gives_the_samples_of_the_same_tokens_in_memory(
    tmp_path: Path, docs: list[str]
) -> None:
    path = hf_data.write_jsonl(tmp_path / "train.jsonl", docs)
    mapped = corpora.load(_settings([path], tmp_path / "cache", format=JSONL)).tokens
    config = semantics.TrainingConfig(
        shape=shapes.named("tiny"), seed=3, global_batch_size=4, micro_batch_size=2
    )
    a = semantics.Job.from_tokens(config, mapped)
    b = semantics.Job.from_tokens(config, np.array(mapped))
    for step in range(3):
        batch = a.sampler.global_batch(step)
        assert batch == b.sampler.global_batch(step)
        for x, y in zip(a.dataset.batch(batch), b.dataset.batch(batch), strict=True):
            assert x.dtype == torch.int64 and torch.equal(x, y)


# --- bad input ----------------------------------------------------------------------------------


def _jsonl_lines(text: str) -> Callable[[Path], messages.DataSettings]:
    def make(folder: Path) -> messages.DataSettings:
        (folder / "d.jsonl").write_text(text, encoding="utf-8")
        return _settings([folder / "d.jsonl"], folder / "cache", format=JSONL)

    return make


def _parquet(column: str, values: list[object]) -> Callable[[Path], messages.DataSettings]:
    def make(folder: Path) -> messages.DataSettings:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({column: values}), folder / "d.parquet")
        return _settings([folder / "d.parquet"], folder / "cache", format=PARQUET)

    return make


def _tokenizer(text: str, separator: str = "") -> Callable[[Path], messages.DataSettings]:
    def make(folder: Path) -> messages.DataSettings:
        (folder / "tok.json").write_text(text, encoding="utf-8")
        (folder / "a.txt").write_text("some text")
        return _settings(
            [folder / "a.txt"],
            folder / "cache",
            tokenizer_path=str(folder / "tok.json"),
            separator=separator,
        )

    return make


def _not_parquet(folder: Path) -> messages.DataSettings:
    (folder / "d.parquet").write_text("not parquet")
    return _settings([folder / "d.parquet"], folder / "cache", format=PARQUET)


def _no_jsonl_files(folder: Path) -> messages.DataSettings:
    (folder / "a.txt").write_text("text, but not JSONL")
    return _settings([folder], folder / "cache", format=JSONL)


BAD_INPUTS: list[tuple[str, Callable[[Path], messages.DataSettings], str]] = [
    (
        "a JSONL field that does not exist",
        _jsonl_lines('{"id": 1, "body": "x"}\n'),
        r"data.textField 'text' is not a field of line 1 of '.*d.jsonl' \(its fields: body, "
        r"id\); name the field that holds the text",
    ),
    (
        "a line that is not JSON",
        _jsonl_lines('{"text": "a"}\n{oops\n'),
        r"line 2 of .* is not JSON",
    ),
    (
        "a line that is not an object",
        _jsonl_lines("[1, 2]\n"),
        r"line 1 of .* is not a JSON object",
    ),
    (
        "a field that is not text",
        _jsonl_lines('{"text": 3}\n'),
        r"'text' of line 1 .* not a string",
    ),
    ("only blank lines", _jsonl_lines("\n\n"), r"is empty: no jsonl documents with text"),
    ("a directory without JSONL files", _no_jsonl_files, r"is empty: no jsonl documents"),
    (
        "a Parquet column that does not exist",
        _parquet("body", ["x"]),
        r"data.textField 'text' is not a column of '.*d.parquet' \(its columns: body\); name "
        r"the column that holds the text",
    ),
    (
        "a Parquet column that is not text",
        _parquet("text", [1, 2]),
        r"is a int64 column; name a string",
    ),
    ("a file that is not Parquet", _not_parquet, r"is not a Parquet file .*; give Parquet files"),
    (
        "a tokenizer file that does not parse",
        _tokenizer("{not json"),
        r"data.tokenizer '.*tok.json' is not a tokenizer.json \(.*\); give a file saved by the "
        r"tokenizers library",
    ),
    ("a tokenizer of the wrong shape", _tokenizer('{"a": 1}'), r"is not a tokenizer.json"),
]


@pytest.mark.parametrize(
    ("make", "problem"),
    [(make, problem) for _, make, problem in BAD_INPUTS],
    ids=[f"{what} is one line naming it and the fix" for what, _, _ in BAD_INPUTS],
)
def test_bad_data_is_one_line_naming_the_field_and_the_fix(
    tmp_path: Path, make: Callable[[Path], messages.DataSettings], problem: str
) -> None:
    with pytest.raises(data.CorpusError, match=problem) as caught:
        corpora.load(make(tmp_path))
    assert "\n" not in str(caught.value)


def test_a_missing_tokenizer_file_and_an_unknown_separator_are_refused(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    (tmp_path / "a.txt").write_text("text")
    missing = _settings([tmp_path / "a.txt"], tmp_path / "c", tokenizer_path="/nowhere/t.json")
    with pytest.raises(corpora.TokenizerError, match=r"'/nowhere/t.json' cannot be read \(No such"):
        corpora.load(missing)
    unknown = _settings(
        [tmp_path / "a.txt"], tmp_path / "c", tokenizer_path=str(tokenizer_file), separator="<eos>"
    )
    with pytest.raises(corpora.TokenizerError, match=r"data.separator '<eos>' is not a token"):
        corpora.load(unknown)


@pytest.mark.parametrize(
    ("module", "changes", "needs"),
    [
        ("tokenizers", {"tokenizer_path": "t.json"}, "data.tokenizer needs the tokenizers library"),
        ("pyarrow", {"format": PARQUET}, "data.format parquet needs pyarrow"),
    ],
    ids=["a tokenizer without the extra says to install it", "Parquet likewise"],
)
def test_a_job_that_needs_the_extra_says_how_to_install_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    changes: dict[str, object],
    needs: str,
) -> None:
    hf_data.write_parquet(tmp_path / "d.parquet", ["x"])
    for name in [m for m in sys.modules if m == module or m.startswith(f"{module}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # what an absent package imports as
    settings_ = _settings([tmp_path / "d.parquet"], tmp_path / "c", **changes)
    with pytest.raises(documents.MissingExtraError) as caught:
        corpora.load(settings_)
    assert str(caught.value) == f"{needs}; install planaria[hf] (pip install 'planaria[hf]')"


def test_the_default_cache_folder_follows_xdg_cache_home() -> None:
    assert corpora.default_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/planaria/tokens")
    assert corpora.default_cache_dir({}) == Path.home() / ".cache" / "planaria" / "tokens"
