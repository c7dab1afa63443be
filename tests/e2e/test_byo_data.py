"""`planaria run` on a JSONL dataset with a tokenizer trained in the test, through a failure.

Covers, with the real command in a subprocess (2 workers, exact reduction, a checkpoint every
2 steps, worker 1 killed at step 3): the run Succeeds; its final checkpoint equals the fault-free
reference trainer's state bitwise (parameters, AdamW moments, step counts), the reference
reading the same corpus through the same cache; the model trained has the tokenizer's
vocabulary (384 embedding rows, not the shape's 256); the command tokenised the corpus once
into the job's cache folder, one entry, which the agents mapped. The bound is a test timeout,
not a performance claim.
"""

from __future__ import annotations

from pathlib import Path

from planaria.agent.runtime import runtime_states
from planaria.agent.state import checkpoints
from planaria.agent.training import comparison
from planaria.spec import conversion, job_file
from tests import hf_data
from tests.e2e import local_job

BOUND_S = 240.0
STEPS = 30  # the injected kill at step 3 lands and is seen long before the last step
JOB = """\
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


def test_a_jsonl_dataset_with_a_trained_tokenizer_trains_exactly_through_a_failure(
    tmp_path: Path, shm: Path
) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    hf_data.train_tokenizer(tokenizer)
    corpus = hf_data.write_jsonl(tmp_path / "train.jsonl", hf_data.stdlib_documents(20))
    text = JOB.format(
        steps=STEPS,
        checkpoints=tmp_path / "ckpt",
        corpus=corpus,
        tokenizer=tokenizer,
        cache=tmp_path / "cache",
    )
    (tmp_path / "job.yaml").write_text(text, encoding="utf-8")
    ran = local_job.run_job_file(tmp_path, "byo", shm, BOUND_S)
    name, recoveries = ran.name, ran.recoveries
    assert f"Succeeded at step {STEPS}" in ran.stdout.splitlines()[-1]
    assert [r["failed"] for r in recoveries] == [[1]]

    settings = conversion.to_settings(job_file.load_job(str(tmp_path / "job.yaml")).spec, name, "-")
    got = checkpoints.load_checkpoint(tmp_path / "ckpt", STEPS)
    want, _ = runtime_states.reference_states(settings.training, 1, STEPS)
    found = comparison.compare(got, want)
    assert found.equal, found.describe()
    embedding = got[0]
    assert tuple(embedding.parameters[embedding.names.index("tokens")].shape) == (384, 64)
    assert len(list((tmp_path / "cache").iterdir())) == 1
