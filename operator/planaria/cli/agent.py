"""`planaria agent`: run one worker's agent, serving planaria.v1 AgentService over gRPC.

    planaria agent --worker W --job NAME (--tls-dir DIR | --insecure) [--listen 127.0.0.1:0]
                   [--snapshot-base DIR] [--ready-file PATH] [--device cpu|cuda] [--threads N]
                   [--grace S]

The controller starts one per worker (a process locally, the container of a pod on Kubernetes)
and drives it over gRPC (`planaria.agent.server.service`). With port 0 the agent binds a free port
and writes the address it bound, "HOST:PORT", to --ready-file once it serves. It exits 0 after a
Stop RPC or SIGTERM/SIGINT (graceful: health NOT_SERVING, the step in flight gets --grace
seconds, then the server stops). torch is imported only inside the handler.

The channel is mutual TLS with --tls-dir (ca.crt, tls.crt, tls.key of the job, as
`planaria.rpc.tls.agent_files` lays them out): only the job's controller may call. Plaintext
needs --insecure, said explicitly; with neither flag the agent refuses to start.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

from planaria.contract import plan
from planaria.local import launching

DEFAULT_LISTEN = "127.0.0.1:0"


class AgentCommandError(ValueError):
    """A flag out of range; names the flag and the fix."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="run one worker's training agent (gRPC server)",
        description="Run one worker's training agent: the gRPC service the controller drives.",
    )
    parser.add_argument("--worker", type=int, required=True, help="this agent's worker id")
    parser.add_argument("--job", required=True, help="the job's name (names snapshot stores)")
    parser.add_argument(
        "--listen", default=DEFAULT_LISTEN, help="HOST:PORT to serve on; port 0 picks a free one"
    )
    parser.add_argument(
        "--snapshot-base",
        type=Path,
        default=launching.DEFAULT_SNAPSHOT_BASE,
        help="directory of host-memory snapshot stores (a tmpfs: /dev/shm, or an emptyDir "
        "with medium Memory)",
    )
    parser.add_argument(
        "--ready-file", type=Path, help="write the bound HOST:PORT here once serving"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to compute")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds the step in flight gets on SIGTERM"
    )
    security = parser.add_mutually_exclusive_group()
    security.add_argument(
        "--tls-dir",
        type=Path,
        help="directory with the job's ca.crt, tls.crt, tls.key: serve mutual TLS and answer "
        "only the job's controller",
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        help="serve plaintext gRPC with no authentication: anyone who reaches the port can "
        "steer the agent (tests and trusted loopback only)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.worker < 0:
        raise AgentCommandError(f"--worker is {args.worker}; give a worker id >= 0")
    if not args.job or "/" in args.job:
        raise AgentCommandError(f"--job is {args.job!r}; give a name without '/'")
    if args.threads < 1:
        raise AgentCommandError(f"--threads is {args.threads}; give 1 or more")
    if not args.grace >= 0:
        raise AgentCommandError(f"--grace is {args.grace}; give seconds >= 0")
    if ":" not in args.listen:
        raise AgentCommandError(f"--listen is {args.listen!r}; give HOST:PORT")
    if args.tls_dir is None and not args.insecure:
        raise AgentCommandError(
            "no --tls-dir; give the job's TLS directory (ca.crt, tls.crt, tls.key), or "
            "--insecure to serve plaintext"
        )
    import torch

    from planaria.agent.server import service

    torch.set_num_threads(args.threads)
    options = service.Options(
        worker=plan.WorkerId(args.worker),
        job=args.job,
        listen=args.listen,
        snapshot_base=args.snapshot_base,
        ready_file=args.ready_file,
        device=args.device,
        grace_s=args.grace,
        tls_dir=args.tls_dir,
    )
    code = service.serve(options)
    # Everything is stopped, flushed and closed. The interpreter's last garbage collection
    # walks every object torch and gRPC left (1.5-2 s here, while the controller waits for the
    # exit); frozen objects are skipped, and finalizers and atexit handlers still run.
    gc.freeze()
    return code
