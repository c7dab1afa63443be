"""The examples in examples/ run as documented and print what they promise: the GPU cluster
planning script, and the bring-your-own-data job with the script that makes its data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from planaria.agent.training import corpora
from planaria.contract import shapes
from planaria.spec import conversion, job_file

ROOT = Path(__file__).resolve().parents[2]


def test_planning_a_gpu_cluster_ends_with_a_recovery_decision() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "examples" / "plan-a-gpu-cluster.sh")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "templates (Oobleck §4.1)" in result.stdout
    assert "recovery policy (Odyssey eq. 8)" in result.stdout
    assert "\nchose " in result.stdout


def test_the_byo_data_example_makes_its_data_and_its_job_tokenises_it(tmp_path: Path) -> None:
    """examples/byo-data: prepare.py writes the dataset and tokenizer; the job file is a valid
    ResilientJob whose data section, pointed at them, tokenises into the cache with the
    tokenizer's vocabulary (the run itself: docs/running.md, "Data")."""
    example = ROOT / "examples" / "byo-data"
    made = subprocess.run(
        [sys.executable, str(example / "prepare.py"), "--out", str(tmp_path), "--documents", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    loaded = job_file.load_job(str(example / "job.yaml"))
    assert loaded.document and loaded.name == "byo-data" and loaded.spec.failures
    assert [Path(p).name for p in loaded.spec.data.corpus_paths or []] == ["train.jsonl"]
    assert Path(loaded.spec.data.tokenizer).name == "tokenizer.json"
    data_spec = loaded.spec.data.model_copy(
        update={
            "corpus_paths": [str(tmp_path / "train.jsonl")],
            "tokenizer": str(tmp_path / "tokenizer.json"),
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    corpus = corpora.load(conversion.data_settings(data_spec, corpus_default="-"))
    assert corpus.vocab_size == 1024 and len(corpus.tokens) > 1000


def test_the_hf_llama_example_is_a_valid_llama_job() -> None:
    """examples/hf-llama: a ResilientJob whose modelSource (the config.json beside it, read
    from the repository root) is a 4-block Llama with the byo-data tokenizer's vocabulary,
    checkpointed for `planaria export` (the run itself: docs/running.md, "Models")."""
    loaded = job_file.load_job(str(ROOT / "examples" / "hf-llama" / "job.yaml"))
    source = loaded.spec.model_source
    assert source is not None and loaded.name == "hf-llama" and loaded.spec.failures
    assert loaded.spec.checkpoints.dir and loaded.spec.data.tokenizer
    config = json.loads((ROOT / source.config_path).read_text(encoding="utf-8"))
    shape = shapes.resolve(shapes.hf_reference(source.family.value, config, source.seq_len))
    assert (shape.family, shape.num_layers, shape.vocab_size, shape.seq_len) == (
        "llama",
        4,
        1024,
        64,
    )
