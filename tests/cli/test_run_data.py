"""`planaria run` with data that needs tokenising: bad data refused before anything starts.

Covers: a JSONL field or a Parquet column that does not exist, a tokenizer file that does not
parse, a separator the tokenizer lacks and an empty corpus each exit 2 with one line
(`planaria: error: job.yaml: ...`, naming the field and the fix, no traceback) and leave no run
directory; a good corpus is tokenised into its cache by the command itself, so its agents only
map the file (tests/e2e/test_byo_data.py trains on it). Plain byte text is not checked here: its
errors are the agents' (tests/cli/test_run_agent_errors.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from planaria.cli import main, run_checks
from planaria.spec import job_file
from tests import hf_data

JOB = (
    "workers: 2\nsteps: 4\nmicroBatchSize: 1\nglobalBatchSize: 2\n"
    "data: {{corpusPaths: [{corpus}], format: {format}, textField: {field}, "
    "tokenizer: '{tokenizer}', separator: '{separator}', cacheDir: {cache}}}\n"
)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    hf_data.train_tokenizer(path, documents=10)
    return path


def _write_job(folder: Path, corpus: Path, **changes: str) -> Path:
    values = {"format": "jsonl", "field": "text", "tokenizer": "", "separator": ""}
    values.update(changes)
    path = folder / "job.yaml"
    path.write_text(JOB.format(corpus=corpus, cache=folder / "cache", **values), encoding="utf-8")
    return path


def _missing_field(folder: Path, tokenizer: Path) -> tuple[Path, str]:
    corpus = hf_data.write_jsonl(folder / "d.jsonl", ["a", "b"], field="body")
    return _write_job(folder, corpus), (
        f"data.textField 'text' is not a field of line 1 of '{corpus}' (its fields: body, id); "
        "name the field that holds the text"
    )


def _missing_column(folder: Path, tokenizer: Path) -> tuple[Path, str]:
    corpus = hf_data.write_parquet(folder / "d.parquet", ["a", "b"])
    return _write_job(folder, corpus, format="parquet", field="body"), (
        f"data.textField 'body' is not a column of '{corpus}' (its columns: id, text); name "
        "the column that holds the text"
    )


def _bad_tokenizer(folder: Path, tokenizer: Path) -> tuple[Path, str]:
    corpus = hf_data.write_jsonl(folder / "d.jsonl", ["a"])
    (folder / "tok.json").write_text('{"version": "1.0"}', encoding="utf-8")
    path = _write_job(folder, corpus, tokenizer=str(folder / "tok.json"))
    return path, f"data.tokenizer '{folder / 'tok.json'}' is not a tokenizer.json ("


def _unknown_separator(folder: Path, tokenizer: Path) -> tuple[Path, str]:
    corpus = hf_data.write_jsonl(folder / "d.jsonl", ["a"])
    path = _write_job(folder, corpus, tokenizer=str(tokenizer), separator="<eos>")
    return path, f"data.separator '<eos>' is not a token of data.tokenizer '{tokenizer}'"


def _empty(folder: Path, tokenizer: Path) -> tuple[Path, str]:
    corpus = folder / "empty.jsonl"
    corpus.write_text("\n", encoding="utf-8")
    return _write_job(folder, corpus, tokenizer=str(tokenizer)), (
        f"corpus '{corpus}' is empty: no jsonl documents with text; name files or directories "
        "that hold text"
    )


@pytest.mark.parametrize(
    "case",
    [_missing_field, _missing_column, _bad_tokenizer, _unknown_separator, _empty],
    ids=[
        "a JSONL field that does not exist exits 2 naming it",
        "a Parquet column that does not exist exits 2 naming it",
        "a tokenizer file that does not parse exits 2 naming it",
        "a separator the tokenizer lacks exits 2 naming it",
        "an empty corpus exits 2 naming it",
    ],
)
def test_bad_data_exits_2_before_anything_starts(
    tmp_path: Path, tokenizer_file: Path, case: Callable[[Path, Path], tuple[Path, str]]
) -> None:
    job, problem = case(tmp_path, tokenizer_file)
    err = io.StringIO()
    out = tmp_path / "out"
    with contextlib.redirect_stderr(err):
        code = main.main(["run", str(job), "--out", str(out), "--no-progress"])
    line = err.getvalue()
    assert code == 2, line
    assert line.startswith(f"planaria: error: {job}: {problem}"), line
    assert line.count("\n") == 1 and "Traceback" not in line
    assert not out.exists()
    assert not [p for p in (tmp_path / "cache").glob("*") if p.is_dir()]  # nothing half-built


def test_the_command_tokenises_a_good_corpus_into_its_cache(
    tmp_path: Path, tokenizer_file: Path
) -> None:
    corpus = hf_data.write_jsonl(tmp_path / "d.jsonl", hf_data.stdlib_documents(3))
    job = _write_job(tmp_path, corpus, tokenizer=str(tokenizer_file), separator="</s>")
    args = argparse.Namespace(
        job=str(job),
        fail=[],
        mtbf=None,
        metrics_port=None,
        out=str(tmp_path / "out"),
        snapshot_base=str(tmp_path / "shm"),
    )
    run_checks.options(args, job_file.load_job(str(job)), "data-job", live=False)
    (entry,) = (tmp_path / "cache").iterdir()
    assert (entry / "meta.json").is_file() and (entry / "tokens.bin").stat().st_size > 0
