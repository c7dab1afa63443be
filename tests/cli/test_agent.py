"""`planaria agent` as a process: bad flags, the ready file, health, and a graceful SIGTERM.

Covers: a negative worker id, a job name with '/', a --listen without a port, --threads 0, or
neither --tls-dir nor --insecure is one line on stderr with exit status 2; a started (--insecure)
agent writes HOST:PORT to its ready file, answers health SERVING there, and exits 0 on SIGTERM
(Stop -> exit 0 is in tests/rpc; TLS in tests/rpc/test_tls.py and tests/local).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

AGENT = [sys.executable, "-m", "planaria", "agent"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--worker", "-1", "--job", "j"], "--worker"),
        (["--worker", "1", "--job", "a/b"], "--job"),
        (["--worker", "1", "--job", "j", "--listen", "nohost"], "--listen"),
        (["--worker", "1", "--job", "j", "--threads", "0"], "--threads"),
        (["--worker", "1", "--job", "j"], "no --tls-dir"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(flags: list[str], said: str) -> None:
    done = subprocess.run([*AGENT, *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("planaria: error:") and said in done.stderr
    assert "Traceback" not in done.stderr


def test_an_agent_serves_health_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = [
        *AGENT,
        "--worker",
        "0",
        "--job",
        "cli-test",
        "--ready-file",
        str(ready),
        "--insecure",
    ]
    command += ["--snapshot-base", str(tmp_path / "shm")]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with grpc.insecure_channel(ready.read_text().strip()) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert process.stderr is not None
        assert "worker 0 serving on" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
