"""One GPU per local worker (planaria.local.devices) and how `planaria run` uses it.

Covers: the visible GPU ids come from CUDA_VISIBLE_DEVICES in its order (blank entries dropped,
cut to the count torch sees) or are 0..count-1; worker w gets the w-th GPU, no two workers one
GPU, for any worker and GPU count that fit (hypothesis, against the rule written out); too few
GPUs or none is refused in one line naming what the machine shows and the fix; each agent starts
with `--device cuda` and sees only its own GPU, a cpu job's agents see the environment as it is;
`planaria run`'s checks ask for the GPU count only for a cuda job and refuse a cuda job the
machine cannot hold; the run's backend starts (and restarts) workers with those arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planaria.cli import run, run_checks
from planaria.contract import plan
from planaria.local import devices
from planaria.spec import job_file

W = plan.WorkerId


@pytest.mark.parametrize(
    ("env", "count", "expected"),
    [
        ({}, 0, ()),
        ({}, 3, ("0", "1", "2")),
        ({"CUDA_VISIBLE_DEVICES": "3,1"}, 2, ("3", "1")),
        ({"CUDA_VISIBLE_DEVICES": " 2 , ,5"}, 2, ("2", "5")),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 1, ("GPU-aa",)),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0, ()),
    ],
)
def test_the_visible_gpus_are_listed_as_a_child_would_name_them(
    env: dict[str, str], count: int, expected: tuple[str, ...]
) -> None:
    assert devices.visible_gpus(env, count=count) == expected


@given(gpus=st.lists(st.text("0123456789", min_size=1, max_size=2), unique=True, max_size=9))
def test_each_worker_gets_its_own_gpu_by_index(gpus: list[str]) -> None:
    for workers in range(1, len(gpus) + 1):
        assignment = devices.assign(workers=workers, gpus=tuple(gpus))
        assert assignment == {W(w): gpus[w] for w in range(workers)}
        assert len(set(assignment.values())) == workers


@given(gpus=st.integers(0, 8), extra=st.integers(1, 8))
def test_more_workers_than_gpus_is_refused(gpus: int, extra: int) -> None:
    visible = tuple(str(g) for g in range(gpus))
    with pytest.raises(devices.DeviceError) as refused:
        devices.assign(workers=gpus + extra, gpus=visible)
    assert "\n" not in str(refused.value) and "device: cpu" in str(refused.value)
    if gpus:
        assert f"with {gpus + extra} workers, but this machine shows {gpus} GPU" in str(
            refused.value
        )
        assert f"give workers: {gpus} or fewer" in str(refused.value)
    else:
        assert "no GPU is visible here" in str(refused.value)


def test_a_cuda_agent_sees_only_its_gpu_and_a_cpu_agent_its_environment() -> None:
    args, placement = devices.launch("cuda", {W(0): "3", W(1): "1"})
    assert args == ("--device", "cuda")
    assert placement(W(1)).env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert placement(W(0)).env == {"CUDA_VISIBLE_DEVICES": "3"}
    args, placement = devices.launch("cpu", {})
    assert args == ("--device", "cpu") and placement(W(0)).env == {}


def _loaded(tmp_path: Path, text: str) -> tuple[argparse.Namespace, job_file.JobFile]:
    path = tmp_path / "job.yaml"
    path.write_text("steps: 4\nmicroBatchSize: 1\nglobalBatchSize: 2\n" + text)
    args = argparse.Namespace(
        job=str(path),
        fail=[],
        mtbf=None,
        metrics_port=None,
        out=str(tmp_path / "out"),
        snapshot_base=str(tmp_path / "shm"),
    )
    return args, job_file.load_job(path)


def test_the_checks_give_a_cuda_job_one_gpu_per_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args, loaded = _loaded(tmp_path, "workers: 2\ndevice: cuda\n")
    options = run_checks.options(args, loaded, "j", live=False, gpu_count=lambda: 2)
    assert options.gpus == {W(0): "0", W(1): "1"}


def test_the_checks_refuse_a_cuda_job_with_more_workers_than_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    args, loaded = _loaded(tmp_path, "workers: 3\ndevice: cuda\n")
    with pytest.raises(run_checks.RunCommandError) as refused:
        run_checks.options(args, loaded, "j", live=False, gpu_count=lambda: 2)
    assert str(refused.value) == (
        f"{args.job}: device: cuda with 3 workers, but this machine shows 2 GPUs (4, 6); local "
        "mode runs one worker per GPU: give workers: 2 or fewer, or device: cpu"
    )


def test_the_checks_of_a_cpu_job_never_ask_for_gpus(tmp_path: Path) -> None:
    def asked() -> int:
        raise AssertionError("a cpu job asked for the GPU count")

    args, loaded = _loaded(tmp_path, "workers: 2\n")
    assert run_checks.options(args, loaded, "j", live=False, gpu_count=asked).gpus == {}


@pytest.mark.asyncio
async def test_the_runs_backend_starts_each_worker_on_its_gpu(tmp_path: Path) -> None:
    backend, adopted = await run._backend(
        "gpus", tmp_path, None, snapshot_base=tmp_path / "shm", device=("cuda", {W(0): "5"})
    )
    try:
        assert adopted is None
        launch = backend._processes._launch_as
        where = launch.placement(W(0))
        command = launch.command(W(0), where, tmp_path / "ready")
        assert command[command.index("--device") + 1] == "cuda"
        assert where.env == {"CUDA_VISIBLE_DEVICES": "5"}
    finally:
        await backend.shutdown()
