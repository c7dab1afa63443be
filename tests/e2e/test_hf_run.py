"""`planaria run` on a Hugging Face Llama and a GPT-2 (modelSource) with a trained tokenizer,
through a failure, then `planaria export`.

Covers, with the real command in a subprocess (2 workers, exact reduction, a 2-block Llama with
grouped-query attention, and a 2-block GPT-2 whose embeddings are tied, from a config.json, a
JSONL dataset and a tokenizer trained in the test, a checkpoint every 2 steps, worker 1 killed
at step 3): the run Succeeds after one recovery; its final checkpoint equals the fault-free
reference trainer's state bitwise (parameters, AdamW moments, step counts; for GPT-2 the tied
reference); `planaria export` writes the checkpoint as a folder that transformers'
`AutoModelForCausalLM.from_pretrained` loads with the tokenizer's vocabulary (GPT-2 tied), and
that model's logits equal Planaria's layers holding the checkpoint's states bit for bit. The
bound is a test timeout, not a performance claim.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints
from planaria.agent.training import comparison, model
from planaria.cli import main
from planaria.contract import shapes
from planaria.spec import conversion, job_file
from tests import hf_data
from tests.e2e import local_job

transformers = pytest.importorskip("transformers")

BOUND_S = 240.0
STEPS = 16  # the kill once step 3 is committed is seen long before the last step
CONFIGS = {
    "llama": {
        "vocab_size": 384,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    # GPT-2 ties lm_head to wte (its default): trained tied across the stages
    "gpt2": {
        "vocab_size": 384,
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 32,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
}
JOB = """\
modelSource: {{family: {family}, configPath: {config}, seqLen: 32}}
workers: 2
steps: {steps}
microBatchSize: 1
globalBatchSize: 2
seed: 3
reduction: exact
snapshots: {{intervalSteps: 1}}
checkpoints: {{dir: {checkpoints}, intervalSteps: 2}}
failures: [{{step: 3, worker: 1}}]
data:
  corpusPaths: [{corpus}]
  format: jsonl
  tokenizer: {tokenizer}
  separator: "</s>"
  cacheDir: {cache}
"""


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_model_trains_exactly_through_a_failure_and_exports_to_transformers(
    tmp_path: Path, shm: Path, family: str
) -> None:
    hf_data.train_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[family]), encoding="utf-8")
    corpus = hf_data.write_jsonl(tmp_path / "train.jsonl", hf_data.stdlib_documents(12))
    text = JOB.format(
        family=family,
        config=tmp_path / "config.json",
        steps=STEPS,
        checkpoints=tmp_path / "ckpt",
        corpus=corpus,
        tokenizer=tmp_path / "tokenizer.json",
        cache=tmp_path / "cache",
    )
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    ran = local_job.run_job_file(tmp_path, "hf", shm, BOUND_S)
    name, recoveries = ran.name, ran.recoveries
    assert f"Succeeded at step {STEPS}" in ran.stdout.splitlines()[-1]
    assert [r["failed"] for r in recoveries] == [[1]]

    spec = job_file.load_job(str(tmp_path / "job.yaml")).spec
    settings = conversion.to_settings(spec, name, "-")
    got = checkpoints.load_checkpoint(tmp_path / "ckpt", STEPS)
    want, _ = runtime_states.reference_states(settings.training, 1, STEPS)
    found = comparison.compare(got, want)
    assert found.equal, found.describe()

    out = tmp_path / "export"
    job_path = str(tmp_path / "job.yaml")
    assert (
        main.main(["export", job_path, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)])
        == 0
    )
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert loaded.config.vocab_size == 384 and (out / "tokenizer.json").is_file()
    assert loaded.config.tie_word_embeddings is (family == "gpt2")
    shape = shapes.resolve(settings.training.model)
    layers = model.build_layers(shape, seed=0)
    for index, layer in enumerate(layers):
        optimizer = model.make_optimizer(layer, model.OptimizerConfig())
        model.load_layer_state(index, layer, optimizer, got[index])
    ids = torch.randint(0, 384, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model.run_layers(layers, ids))
