"""Where and how a worker's agent process is started: its `Placement` (listen address, command
prefix, extra environment) and the job's `AgentLaunch` (the `python -m planaria agent` command
line, the ready file and log of each worker).

Values and paths only: starting, watching and stopping the processes is
`planaria.local.supervision`'s. Nothing here imports torch or gRPC, so `planaria run` can work
out placements (`planaria.local.devices`) before it loads them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from planaria.contract import plan
from planaria.local import adoption

LOOPBACK = "127.0.0.1"
# Where agents keep their host-memory snapshot stores unless told otherwise (a tmpfs).
DEFAULT_SNAPSHOT_BASE = Path("/dev/shm/planaria")


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one worker's agent process runs: the address it listens on (and its peers reach
    it at), a command prefix it is started under (e.g. `ip netns exec NAME`, for a worker in
    its own network namespace) and environment added to this process's (e.g.
    `GLOO_SOCKET_IFNAME`). The default: loopback, no prefix, this process's environment."""

    host: str = LOOPBACK
    prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentLaunch:
    """How a worker's agent is started and where its files go (module docstring)."""

    job: str
    run_dir: Path
    snapshot_base: Path
    agent_args: tuple[str, ...]
    placement: Callable[[plan.WorkerId], Placement]

    def paths(self, worker: plan.WorkerId) -> tuple[Path, Path]:
        """`worker`'s ready file and log, in `<run_dir>/workers` (made if missing)."""
        folder = self.run_dir / "workers"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"worker-{worker}.ready", folder / f"worker-{worker}.log"

    def pid_file(self, worker: plan.WorkerId) -> Path:
        return self.run_dir / "workers" / f"worker-{worker}{adoption.SUFFIX}"

    def command(self, worker: plan.WorkerId, where: Placement, ready: Path) -> list[str]:
        return [
            *where.prefix,
            *(sys.executable, "-m", "planaria", "agent"),
            *("--worker", str(worker), "--job", self.job),
            *("--listen", f"{where.host}:0", "--ready-file", str(ready)),
            *("--snapshot-base", str(self.snapshot_base)),
            *("--tls-dir", str(self.run_dir / "tls" / "agent")),
            *self.agent_args,
        ]
