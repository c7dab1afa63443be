"""Restarting agent processes that exit on their own: what a kubelet does for a pod's container.

On Kubernetes a worker's agent that crashes comes back (its pod is replaced); `planaria run`
has no kubelet, so `planaria.local.backend.LocalBackend` (through `planaria.local.supervision`)
applies this policy to its agent processes itself (docs/local-mode.md, "Agents that exit on
their own"):
- which exits restart (`unexpected`): a crash, a signal from outside (the OOM killer, a user's
  `kill -9`), an exception at set-up; not exit code 0 (an agent exits 0 only when told to stop:
  a Stop RPC or SIGTERM, as kubelet's restartPolicy OnFailure), not a kill the backend made on
  purpose (`LocalBackend.kill`: failure injection, whose `rejoin` restarts it or not);
- when (`RestartPolicy.backoff_s`): after `initial_backoff_s`, doubling with every restart of the
  same worker up to `max_backoff_s`, like kubelet's CrashLoopBackOff;
- until: a worker restarted `max_restarts` times is not restarted again when it exits on its
  own once more; the backend gives up and says why in one line (`cause`), and `planaria run`
  ends the job Failed with it, so a process that cannot run is never an endless loop or a hang;
- forgiven (`RestartPolicy.counted`): a process that ran `reset_after_s` or longer before it
  exited proved that the worker can run, so its exit starts the count and the back-off afresh
  (kubelet resets CrashLoopBackOff after 10 minutes of running): a job of days is not failed by
  five crashes days apart, while a crash loop is still caught within minutes.

Pure: no processes and no clock here; the backend sleeps and launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planaria.contract import plan

_MAX_DOUBLINGS = 64  # 2.0 ** 64 times any sane initial back-off is past every cap


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    """At most `max_restarts` restarts per worker in a row (0: none), the first
    `initial_backoff_s` seconds after the exit, each next one twice as late, never later than
    `max_backoff_s`; a process that ran `reset_after_s` or longer starts the row afresh
    (module docstring)."""

    max_restarts: int = 5
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    reset_after_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts is {self.max_restarts}; give 0 or more")
        if not self.initial_backoff_s > 0:
            raise ValueError(f"initial_backoff_s is {self.initial_backoff_s}; give seconds > 0")
        if not self.max_backoff_s >= self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s {self.max_backoff_s} is below initial_backoff_s "
                f"{self.initial_backoff_s}; give a cap at least the first back-off"
            )
        if not self.reset_after_s >= 0:  # inf: never forgiven
            raise ValueError(f"reset_after_s is {self.reset_after_s}; give seconds >= 0")

    def counted(self, restarts: int, ran_s: float) -> int:
        """The restarts that count against a worker restarted `restarts` times in a row whose
        process has just exited on its own after running `ran_s` seconds: 0 when it ran
        `reset_after_s` or longer, `restarts` otherwise."""
        return 0 if ran_s >= self.reset_after_s else restarts

    def backoff_s(self, restarts: int) -> float | None:
        """Seconds to wait before the next restart of a worker already restarted `restarts`
        times: initial x 2^restarts, capped; None when no restart is left."""
        if restarts >= self.max_restarts:
            return None
        doubled = self.initial_backoff_s * 2.0 ** min(restarts, _MAX_DOUBLINGS)
        return min(self.max_backoff_s, doubled)


DEFAULT = RestartPolicy()
NEVER = RestartPolicy(max_restarts=0)


def unexpected(code: int | None, *, on_purpose: bool) -> bool:
    """Whether an agent process that exited with `code` (None: an adopted process, whose status
    only its parent saw) is restarted (module docstring). An adopted agent's exit counts as
    unexpected: its graceful stop at the job's end is followed by the backend's shutdown, which
    cancels the pending restart."""
    return not on_purpose and code != 0


def cause(worker: plan.WorkerId, restarts: int, exit_: str, log: Path) -> str:
    """The one line that says why the backend gave up on `worker`: `exit_` is how its last
    process ended ("process 41 exited with exit code 3")."""
    return (
        f"worker {worker}'s agent {exit_} after {restarts} restart(s); not restarted again "
        f"(see {log})"
    )
