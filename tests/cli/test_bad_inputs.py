"""`planaria run` as a user meets it, the real command in a subprocess: bad input refused before
anything starts, and signals that stop a run cleanly.

Covers: a `--fail` naming a worker the job lacks, a step past the last, bad `--fail` and
`--mtbf` text, and an unusable `--out` or `--snapshot-base` (a file, a path under a file, a
path under /proc, a read-only directory), and `device: cuda` where no GPU is visible, each exit
2 within the bound with one line
(`planaria: error: ...`: what is wrong and what to give instead, no traceback), leaving no run
directory, lock, snapshot store or agent process; a failure in the job file is refused in the
words the same `--fail` gets. SIGTERM to a training run (one agent: a short start), and SIGHUP
followed by a second signal while it stops (a forced stop), exit 143 and 129 within the bound,
every agent gone (their pid files, and any process in their sessions), the job's snapshot
store removed, one console line saying the run was interrupted and where the report is, and
summary.md's first line saying so. Bounds are timeouts, not performance claims.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from planaria.local import adoption
from tests.chaos import processes

BOUND_S = 60.0  # to refuse a command, or to exit after a signal
START_S = 120.0  # to train a first step: agents import torch, 2 shared cores may be busy
COMMAND = (sys.executable, "-m", "planaria", "run")
# The job every refused command names (never trained), and the one a signal interrupts.
SMALL = "workers: 2\nsteps: 4\nmicroBatchSize: 1\nglobalBatchSize: 2\n"
LONG = "workers: 1\nfaultTolerance: 0\nsteps: 100000\nmicroBatchSize: 1\nglobalBatchSize: 1\n"
MISSING_WORKER = "worker 7 does not exist (workers 0..1); give one of them or 'random'"
TRAINED = re.compile(r"Running +step [1-9]")  # a plain progress line after a committed step


def _job(folder: Path, text: str = SMALL) -> Path:
    path = folder / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _refused(folder: Path, *extra: str, prefix: tuple[str, ...] = ()) -> str:
    """Run `planaria run folder/job.yaml ...extra` (under `prefix`), which must be refused;
    returns its error line, after checking exit 2 within the bound, no traceback, nothing on
    stdout, and nothing left: `folder` as it was, no store and no agent of the job."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    before = sorted(folder.rglob("*"))
    argv = (*prefix, *COMMAND, str(folder / "job.yaml"), "--name", name, "--no-progress", *extra)
    done = subprocess.run(
        argv, cwd=folder, capture_output=True, text=True, timeout=BOUND_S, check=False
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("planaria: error: ") and done.stderr.count("\n") == 1
    assert sorted(folder.rglob("*")) == before  # no --out, lock, store or probe left
    assert not (Path("/dev/shm/planaria") / name).exists() and not processes.agents_of(name)
    return done.stderr.removeprefix("planaria: error: ").rstrip("\n")


def _inside(folder: Path) -> tuple[str, ...]:
    return ("--out", str(folder / "out"), "--snapshot-base", str(folder / "shm"))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (("--fail", "step=2:worker=7"), f"--fail 'step=2:worker=7': {MISSING_WORKER}"),
        (
            ("--fail", "step=25"),
            "--fail 'step=25': step 25 is not before the last step 4; "
            "give a step the job will reach",
        ),
        (
            ("--fail", "step=x:worker=1"),
            "--fail 'step=x:worker=1': step is 'x'; give a whole number >= 1",
        ),
        (("--mtbf", "0"), "--mtbf is '0'; give seconds > 0 such as 90s, 1.5m or 2h"),
    ],
    ids=[
        "a failure of a worker the job lacks is refused",
        "a failure after the last step is refused",
        "a failure that does not parse is refused",
        "a zero mean time between failures is refused",
    ],
)
def test_bad_failure_flags_are_refused_before_anything_starts(
    tmp_path: Path, extra: tuple[str, ...], expected: str
) -> None:
    _job(tmp_path)
    assert _refused(tmp_path, *_inside(tmp_path), *extra) == expected


def test_a_failure_in_the_file_is_refused_as_the_same_flag_is(tmp_path: Path) -> None:
    _job(tmp_path, SMALL + "failures: [{step: 2, worker: 7}]\n")
    line = _refused(tmp_path, *_inside(tmp_path))
    assert line == f"{tmp_path / 'job.yaml'}: failures.0.worker: {MISSING_WORKER}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("device: cuda\n", "device: cuda, but no GPU is visible here (torch sees 0 CUDA devices)"),
    ],
    ids=["a cuda job where no GPU is visible"],
)
def test_a_device_the_machine_lacks_is_refused_before_anything_starts(
    tmp_path: Path, text: str, expected: str
) -> None:
    _job(tmp_path, SMALL + text)
    hidden = ("env", "CUDA_VISIBLE_DEVICES=")  # no GPU visible, on any machine
    line = _refused(tmp_path, *_inside(tmp_path), prefix=hidden)
    assert line.startswith(f"{tmp_path / 'job.yaml'}: {expected}"), line
    assert line.endswith(
        "give device: cpu, or run on a machine with a GPU and a CUDA build of torch"
    )


def _a_file(folder: Path) -> str:
    (folder / "plain").write_text("not a directory\n", encoding="utf-8")
    return str(folder / "plain")


def _under_a_file(folder: Path) -> str:
    return str(Path(_a_file(folder)) / "runs")


def _under_proc(folder: Path) -> str:
    return "/proc/planaria-bad-input/runs"


@pytest.mark.parametrize("option", ["--out", "--snapshot-base"])
@pytest.mark.parametrize(
    ("where", "problem"),
    [
        (_a_file, "plain is not a directory"),
        (_under_a_file, "plain is not a directory"),
        (_under_proc, "cannot create or write /proc/planaria-bad-input (No such file"),
    ],
    ids=["a file", "a path under a file", "a path under /proc"],
)
def test_an_unusable_directory_is_refused_in_one_line(
    tmp_path: Path, option: str, where: Callable[[Path], str], problem: str
) -> None:
    _job(tmp_path)
    path = where(tmp_path)
    given = {"--out": str(tmp_path / "out"), "--snapshot-base": str(tmp_path / "shm")}
    given[option] = path
    line = _refused(tmp_path, *(word for pair in given.items() for word in pair))
    assert line.startswith(f"{option} {path}: ") and problem in line, line
    assert line.endswith(f"; give {option} a directory you can write")


def _read_only(folder: Path) -> tuple[tuple[str, ...], str]:
    """A command prefix under which `folder` is read-only, and the error it gives. root writes
    in a 0555 directory (the check tries, so it rightly lets root), so root gets a read-only
    tmpfs over `folder` in a mount namespace of the command's own; others get mode 0555."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return (), "Permission denied"
    mount = ("unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro none "$0" && exec "$@"')
    probe = subprocess.run([*mount, str(folder), "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no read-only mount for root here: {probe.stderr.decode().strip()}")
    return (*mount, str(folder)), "Read-only file system"


@pytest.mark.parametrize("option", ["--out", "--snapshot-base"])
def test_a_read_only_directory_is_refused(tmp_path: Path, option: str) -> None:
    _job(tmp_path)
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    given = {"--out": str(tmp_path / "out"), "--snapshot-base": str(tmp_path / "shm")}
    given[option] = str(readonly / "sub")
    prefix, reason = _read_only(readonly)
    try:
        line = _refused(tmp_path, *(w for pair in given.items() for w in pair), prefix=prefix)
    finally:
        readonly.chmod(0o755)
    assert line == (
        f"{option} {readonly / 'sub'}: cannot create or write {readonly / 'sub'} ({reason}); "
        f"give {option} a directory you can write"
    )


def _pids(out: Path) -> list[int]:
    """The agents' pids from their pid files (planaria.local.adoption)."""
    found = (adoption.read(path) for path in sorted((out / "workers").glob("*.pid")))
    return [entry[0] for entry in found if entry is not None]


def _read_until(process: subprocess.Popen[bytes], pattern: re.Pattern[str]) -> list[str]:
    """Lines of `process`'s stdout up to the first matching `pattern` (AssertionError after
    START_S, or when the output ends first)."""
    assert process.stdout is not None
    deadline, buffer, lines = time.monotonic() + START_S, b"", list[str]()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not any(pattern.search(line) for line in lines):
            left = deadline - time.monotonic()
            assert left > 0, f"no {pattern.pattern!r} within {START_S} s: {lines}"
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            assert chunk, f"the run ended before {pattern.pattern!r}: {lines}"
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            lines += [line.decode() for line in done]
    return lines


@pytest.mark.parametrize(
    ("signals", "status"),
    [((signal.SIGTERM,), 143), ((signal.SIGHUP, signal.SIGINT), 129)],
    ids=[
        "SIGTERM stops the run and exits 143",
        "SIGHUP then a second signal while stopping force the stop and exit 129",
    ],
)
def test_a_signal_stops_every_agent_removes_the_store_and_reports_it(
    tmp_path: Path, signals: tuple[signal.Signals, ...], status: int
) -> None:
    name, out, shm = f"sig-{uuid.uuid4().hex[:8]}", tmp_path / "out", tmp_path / "shm"
    argv = [*COMMAND, str(_job(tmp_path, LONG)), "--name", name, "--no-progress"]
    argv += ["--out", str(out), "--snapshot-base", str(shm)]
    recorder = processes.Recorder()
    with (tmp_path / "stderr").open("wb") as errors:
        run = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=errors)
    try:
        _read_until(run, TRAINED)
        recorder.add(_pids(out))
        assert len(recorder.started) == 1 and (shm / name).is_dir()
        run.send_signal(signals[0])
        for later in signals[1:]:
            time.sleep(0.3)  # the agents are being stopped
            run.send_signal(later)
        rest = run.communicate(timeout=BOUND_S)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        left = recorder.leaked()
        processes.kill(left)
    assert run.returncode == status
    assert left == () and not processes.agents_of(name) and not (shm / name).exists()
    said = f"planaria run: Interrupted by {signals[0].name} at step "
    last = rest.splitlines()[-1]
    assert last.startswith(said) and f"; report in {out}/ (summary.md, " in last, last
    step = int(last.removeprefix(said).split(";")[0])
    first = (out / "summary.md").read_text(encoding="utf-8").splitlines()[0]
    assert step >= 1
    assert first == f"# Run of job `{name}`: Interrupted by {signals[0].name} at step {step}"
    assert b"Traceback" not in (tmp_path / "stderr").read_bytes()
