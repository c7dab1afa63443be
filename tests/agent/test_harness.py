"""The local multi-process harness (planaria.agent.harness.local_cluster): failures, deadlines,
cleanup.

Covers: a hung worker (SIGSTOP mid-step) makes its peer report a latched timeout within the
epoch's timeout, is then killed and listed as lost, and the cluster goes on with the survivors;
a run past its deadline raises HarnessTimeoutError and kills every worker (spawn start method);
closing a cluster leaves no worker process; workers exit on their own when the parent process
is killed; a plan naming a worker the cluster lacks, and a cluster of no workers, are refused.
Lossless training and killed workers are covered in test_executor.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from planaria.agent.harness import local_cluster
from planaria.agent.training import data, model, semantics
from planaria.contract import plan, shapes
from planaria.wire import messages

SHAPE = shapes.ModelShape(
    name="micro", num_layers=2, d_model=16, num_heads=2, seq_len=8, vocab_size=256
)
ROOT = Path(__file__).resolve().parents[2]


def _one_pipeline(*workers: int, micro_batches: int = 2) -> plan.Plan:
    """One pipeline over the 4 planner layers of SHAPE, cut evenly over `workers`."""
    cuts = [0, 2, 4] if len(workers) == 2 else [0, 4]
    stages = tuple(
        plan.Stage(layer_start=a, layer_stop=b, workers=(plan.WorkerId(w),))
        for a, b, w in zip(cuts[:-1], cuts[1:], workers, strict=True)
    )
    return plan.Plan(
        pipelines=(plan.Pipeline(stages=stages, num_micro_batches=micro_batches),),
        micro_batch_size=1,
    )


def _config(p: plan.Plan) -> semantics.TrainingConfig:
    return semantics.TrainingConfig(
        shape=SHAPE,
        seed=1,
        global_batch_size=p.global_batch_size,
        micro_batch_size=1,
        optimizer=model.OptimizerConfig(),
    )


@pytest.fixture(scope="module")
def tokens() -> data.Tokens:
    return data.load_default_corpus(max_bytes=50_000)


def _gone(pid: int) -> bool:
    """True when the process no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def _all_gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(map(_gone, pids)):
            return True
        time.sleep(0.05)
    return all(map(_gone, pids))


def test_a_hung_worker_times_its_peer_out_and_is_killed(tokens: data.Tokens) -> None:
    p = _one_pipeline(0, 1)
    with local_cluster.LocalCluster(workers=[0, 1], tokens=tokens, timeout_s=1.5) as cluster:
        hang = local_cluster.Fault(step=1, index=0, signal=signal.SIGSTOP)
        started = time.monotonic()
        run = cluster.run(_config(p), p, range(50), faults={1: hang})
        elapsed = time.monotonic() - started
        # the peer's receive times out after 1.5 s, the silent worker is killed 1.5 + 3 s later:
        # about 6 s; the bound leaves room for a loaded machine but not for a hang
        assert elapsed < 20
        assert run.lost == (1,) and cluster.alive == (0,)
        error = run.errors[plan.WorkerId(0)]
        assert (error.kind, error.step, error.peer_worker) == (messages.ErrorKind.TIMEOUT, 1, 1)
        assert "RecvGrad" in error.message and run.steps == (0,)
        assert _all_gone([cluster.pids[plan.WorkerId(1)]], within_s=5.0)
        alone = _one_pipeline(0)
        assert cluster.run(_config(alone), alone, range(2)).ok


def test_a_run_past_its_deadline_kills_every_worker(tokens: data.Tokens) -> None:
    p = _one_pipeline(0, micro_batches=8)
    cluster = local_cluster.LocalCluster(workers=[0], tokens=tokens, start_method="spawn")
    with pytest.raises(local_cluster.HarnessTimeoutError, match=r"workers \[0\] did not finish"):
        cluster.run(_config(p), p, range(10**6), deadline_s=0.5)
    assert cluster.alive == ()
    assert _all_gone(list(cluster.pids.values()), within_s=5.0)
    cluster.close()  # closing again is harmless


def test_closing_a_cluster_leaves_no_worker_process(tokens: data.Tokens) -> None:
    with local_cluster.LocalCluster(workers=range(3), tokens=tokens) as cluster:
        pids = list(cluster.pids.values())
        assert len(pids) == 3 and not any(map(_gone, pids))
    assert cluster.alive == ()
    assert _all_gone(pids, within_s=5.0)


def test_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    ready = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from planaria.agent.harness import local_cluster
        from planaria.agent.training import data

        if __name__ == "__main__":
            tokens = data.encode("planaria " * 1000)
            cluster = local_cluster.LocalCluster(workers=range(2), tokens=tokens)
            pids = " ".join(str(pid) for pid in cluster.pids.values())
            Path({str(ready)!r} + ".tmp").write_text(pids)
            Path({str(ready)!r} + ".tmp").replace({str(ready)!r})  # whole, or not at all
            time.sleep(120)
        """
    )
    (tmp_path / "parent.py").write_text(script)
    log = tmp_path / "parent.log"
    with (
        log.open("w") as output,
        subprocess.Popen(
            [sys.executable, str(tmp_path / "parent.py")], cwd=ROOT, stderr=output, stdout=output
        ) as parent,
    ):
        try:
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline and parent.poll() is None:
                time.sleep(0.1)
            assert ready.exists(), f"the parent never got ready: {log.read_text()[-2000:]}"
            pids = [int(pid) for pid in ready.read_text().split()]
            assert len(pids) == 2 and not any(map(_gone, pids))
        finally:
            parent.kill()
    assert _all_gone(pids, within_s=10.0), [(pid, _gone(pid)) for pid in pids]


def test_a_plan_naming_a_missing_worker_is_refused(tokens: data.Tokens) -> None:
    with local_cluster.LocalCluster(workers=[0], tokens=tokens) as cluster:
        p = _one_pipeline(0, 5)
        with pytest.raises(local_cluster.HarnessInputError, match=r"but \[5\] are not alive"):
            cluster.run(_config(p), p, range(1))
    with pytest.raises(local_cluster.HarnessInputError, match="one or more worker ids"):
        local_cluster.LocalCluster(workers=[], tokens=tokens)


def test_the_pid_check_sees_this_process() -> None:
    assert not _gone(os.getpid())
