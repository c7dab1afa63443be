"""`planaria run` and `planaria export` with a Hugging Face modelSource: bad input refused.

Covers: `planaria run` with a checkpointPath whose tensors do not fit the config (another
hidden size) or the tokenizer's vocabulary exits 2 with one line naming
modelSource.checkpointPath and the fix, before anything starts (no run directory); `planaria
export` of a job that trains a named shape, and of a folder without a checkpoint, exit 2 with
one line. The export itself: tests/e2e/test_hf_run.py, tests/agent/test_hf_export.py.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from planaria.agent.training import hf_export
from planaria.cli import main
from tests import hf_data
from tests import hf_models as hf_cases

pytest.importorskip("transformers")


def _planaria(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main.main(list(argv))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama model folder (the tests' 2-block config, vocabulary 256) written by the export."""
    path = tmp_path_factory.mktemp("llama")
    shape = hf_cases.shape("llama")
    hf_export.export(shape, hf_cases.trained(shape)[1], path)
    return path


@pytest.mark.parametrize(
    ("hidden", "tokenizer", "tensor"),
    [(64, False, "model.embed_tokens.weight"), (32, True, "model.embed_tokens.weight")],
    ids=["another hidden size", "the tokenizer's vocabulary"],
)
def test_a_checkpoint_that_does_not_fit_exits_2_before_anything_starts(
    tmp_path: Path, folder: Path, hidden: int, tokenizer: bool, tensor: str
) -> None:
    config = {**hf_cases.LLAMA, "hidden_size": hidden}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    data = ""
    if tokenizer:
        hf_data.train_tokenizer(tmp_path / "tokenizer.json", documents=5)
        corpus = hf_data.write_jsonl(tmp_path / "d.jsonl", hf_data.stdlib_documents(3))
        data = f"data: {{corpusPaths: [{corpus}], format: jsonl, "
        data += f"tokenizer: {tmp_path}/tokenizer.json}}\n"
    job = tmp_path / "job.yaml"
    job.write_text(
        f"modelSource: {{family: llama, configPath: {tmp_path}/config.json, "
        f"checkpointPath: {folder}}}\nworkers: 2\nsteps: 4\nmicroBatchSize: 1\n"
        f"globalBatchSize: 2\n{data}",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    code, line = _planaria("run", str(job), "--out", str(out), "--no-progress")
    assert code == 2, line
    assert line.startswith(f"planaria: error: {job}: modelSource.checkpointPath: tensor {tensor!r}")
    assert line.count("\n") == 1 and "Traceback" not in line and not out.exists()


def test_exports_that_cannot_be_made_exit_2(tmp_path: Path, folder: Path) -> None:
    named = tmp_path / "named.yaml"
    named.write_text("model: tiny\n", encoding="utf-8")
    code, line = _planaria("export", str(named), "--checkpoint", "c", "--out", str(tmp_path / "x"))
    assert code == 2 and "export writes Hugging Face models only" in line and line.count("\n") == 1
    job = tmp_path / "job.yaml"
    job.write_text(f"modelSource: {{family: llama, checkpointPath: {folder}}}\n", encoding="utf-8")
    code, line = _planaria("export", str(job), "--checkpoint", str(tmp_path), "--out", "x")
    assert (
        code == 2
        and line
        == f"planaria: error: --checkpoint {tmp_path}: holds no checkpoint; give checkpoints.dir\n"
    )
