"""Benchmark: what mutual TLS costs on the controller-agent channel (issue #10).

- issue: `planaria.rpc.tls.issue` (a P-256 CA and two leaves) plus writing both directories,
  the work `LocalBackend` adds to its construction;
- connect: a fresh channel, as `AgentClient.connect` opens it, until it is ready (a new TCP
  connection, and for TLS the handshake with both certificates verified);
- configure: one Configure round trip on a connected client (the agent behind it answers at
  once: a fake runtime, so only the channel and the codec are timed);
- watch: opening a Watch stream until its first heartbeat arrives.

The agent is `planaria.agent.server.service.serve` on 127.0.0.1 in this process (its own thread
pool), once plaintext and once with `tls_dir`; the client is the controller's grpc.aio client. Both
share one interpreter, so absolute times include GIL hand-offs; the plaintext/TLS ratio is the
figure to read. Prints median / p90 milliseconds per (case, channel) and writes
bench/results/tls.json.

    .venv/bin/python bench/tls.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import cast

import grpc
import grpc.aio

from planaria.agent.server import service
from planaria.contract import plan, profile
from planaria.contract import rendezvous as rendezvous_keys
from planaria.rpc import client, tls
from planaria.wire import messages

RESULTS = Path(__file__).parent / "results" / "tls.json"
JOB = "bench-tls"
W = plan.WorkerId(0)


class _Runtime:
    """Answers every command at once (only the channel is measured)."""

    def configure(self, config: messages.WorkerConfig) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def heartbeat(self) -> messages.Heartbeat:
        return messages.Heartbeat(
            worker=W,
            epoch=1,
            state=messages.AgentState.IDLE,
            last_committed_step=0,
            loss=None,
            samples_processed=0,
            timings=messages.Timings(),
            snapshot=messages.SnapshotState(),
        )

    def pause(self, epoch: int) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    resume = take_snapshot = pause

    def stop(self, grace_s: float) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def snapshot_state(self) -> messages.SnapshotState:
        return messages.SnapshotState()

    def load_snapshot(self, load: messages.SnapshotLoad) -> messages.Acknowledgement:
        return messages.Acknowledgement(accepted=True)

    def profile(self, order: messages.ProfileOrder) -> profile.Profile:
        raise ValueError("not profiled here")

    def wait_stopped(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def _config() -> messages.WorkerConfig:
    stage = plan.Stage(layer_start=0, layer_stop=6, workers=(W,))
    pipeline = plan.Pipeline(stages=(stage,), num_micro_batches=1)
    rendezvous = messages.Rendezvous(
        store_host="127.0.0.1",
        store_port=1234,
        key_prefix=rendezvous_keys.key_prefix(1),
        rank=0,
        world_size=1,
        backend=messages.Backend.GLOO,
        timeout_s=5.0,
    )
    settings = messages.TrainingSettings(
        model="tiny",
        seed=1,
        optimizer=messages.OptimizerSettings(lr=1e-3),
        global_batch_size=1,
        data=messages.DataSettings(corpus_paths=("corpus.txt",)),
        device=messages.Device.CPU,
        snapshot_interval_steps=0,
        redundancy=messages.RedundancyMode.NONE,
    )
    return messages.WorkerConfig(
        epoch=1,
        worker=W,
        plan=plan.Plan(pipelines=(pipeline,), micro_batch_size=1),
        resume_step=0,
        rendezvous=rendezvous,
        transfers=(),
        settings=settings,
    )


def _serve(folder: Path, tls_dir: Path | None) -> tuple[str, threading.Thread]:
    ready = folder / f"ready-{'tls' if tls_dir else 'plain'}"
    options = service.Options(worker=W, job=JOB, ready_file=ready, grace_s=0.1, tls_dir=tls_dir)
    thread = threading.Thread(target=service.serve, args=(options, _Runtime()), daemon=True)
    thread.start()
    while not ready.exists():
        time.sleep(0.01)
    return ready.read_text().strip(), thread


async def _timed(runs: int, once: Callable[[], Awaitable[object]]) -> list[float]:
    await once()  # warm-up: first-call costs (imports, channel set-up) are not the figure
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await once()
        times.append((time.perf_counter() - start) * 1e3)
    return times


async def _channel_cases(
    address: str, credentials: tls.ControllerTls | None, runs: int
) -> dict[str, list[float]]:
    async def connect() -> None:
        channel = _fresh_channel(address, credentials)
        await asyncio.wait_for(channel.channel_ready(), 5)
        await channel.close(None)

    agent = await client.AgentClient.connect(W, address, timeout_s=5, tls=credentials)
    config = _config()

    async def first_heartbeat() -> None:
        # AgentClient.watch is an async generator: close it so its stream is cancelled now
        stream = cast(AsyncGenerator[messages.Heartbeat, None], agent.watch(0.5))
        await stream.__anext__()
        await stream.aclose()

    try:
        return {
            "connect": await _timed(runs, connect),
            "configure": await _timed(runs, lambda: agent.configure(config)),
            "watch": await _timed(runs, first_heartbeat),
        }
    finally:
        await agent.stop(0.1)
        await agent.close()


def _fresh_channel(address: str, credentials: tls.ControllerTls | None) -> grpc.aio.Channel:
    """The channel `AgentClient.connect` opens, on a private subchannel pool: grpc otherwise
    shares a connection among channels to one address and a plaintext "connect" is free."""
    options: list[tuple[str, str | int]] = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    secure = grpc.ssl_channel_credentials(
        credentials.ca_cert_pem, credentials.key_pem, credentials.cert_pem
    )
    options.append(("grpc.ssl_target_name_override", credentials.server_name))
    return grpc.aio.secure_channel(address, secure, options=options)


def _issue_times(folder: Path, runs: int) -> list[float]:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        creds = tls.issue(JOB)
        tls.write_dir(tls.agent_files(creds), folder / f"issue-{i}" / "agent")
        tls.write_dir(tls.controller_files(creds), folder / f"issue-{i}" / "controller")
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure(runs: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        rows.append(_row("issue", "tls", _issue_times(folder, runs)))
        creds = tls.issue(JOB)
        tls.write_dir(tls.agent_files(creds), folder / "agent")
        for channel, tls_dir, controller in (
            ("plaintext", None, None),
            ("tls", folder / "agent", tls.controller_tls(creds)),
        ):
            address, thread = _serve(folder, tls_dir)
            cases = asyncio.run(_channel_cases(address, controller, runs))
            thread.join(10)
            rows += [_row(case, channel, times) for case, times in cases.items()]
    return rows


def _row(case: str, channel: str, times: list[float]) -> dict[str, object]:
    ordered = sorted(times)
    return {
        "case": case,
        "channel": channel,
        "runs": len(times),
        "median_ms": statistics.median(times),
        "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="timings per case (default 200)")
    args = parser.parse_args()
    rows = measure(args.runs)
    print("{:<10} {:<10} {:>10} {:>8}".format("case", "channel", "median ms", "p90"))
    for r in rows:
        print(f"{r['case']:<10} {r['channel']:<10} {r['median_ms']:>10.3f} {r['p90_ms']:>8.3f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
