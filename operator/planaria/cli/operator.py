"""`planaria operator`: the Kubernetes operator (the chart's Deployment runs it).

    planaria operator --namespace NS [--namespace NS2 ...] (--peering NAME | --standalone)
                      [--agent-image IMAGE] [--store-port P] [--health-port P]
                      [--metrics-port P] [--reconcile-seconds S]

The Kubernetes composition root (docs/operator.md): kopf runs the handlers of
`planaria.kube.handlers` for ResilientJobs in the given namespaces, each job's controller with
pods as workers. Login is kopf's own (the pod's service account in a cluster, else KUBECONFIG)
and so is `planaria.kube.api`'s. `--peering NAME` elects one active replica among several
through kopf's peering object NAME (the others pause and take over when it goes); `--standalone`
runs one replica without it. Each replica's peering priority is its start time (earlier is
higher), since kopf pauses all replicas that share the highest priority. The liveness endpoint
is `/healthz` on --health-port; job metrics are Prometheus text on --metrics-port
(`planaria.control.metrics`, labelled by job). The pod's IP, where the jobs' rendezvous stores
listen, comes from POD_IP (the downward API; 127.0.0.1 when unset); the agent image from
--agent-image, else PLANARIA_AGENT_IMAGE; the log level from PLANARIA_LOG_LEVEL (debug, info,
warning or error; default info), read once here.

Exit status: 0 after SIGTERM/SIGINT (kopf's graceful stop: running jobs are detached, not
stopped, and the next operator adopts them), 2 for a bad option.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
import time

from planaria.kube import constants

LOG_LEVELS = ("debug", "info", "warning", "error")  # the chart's logLevel values


class OperatorCommandError(ValueError):
    """An option of `planaria operator` out of range; names the option and the fix."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator for ResilientJobs",
        description="Run the Kubernetes operator: watch ResilientJobs in the given namespaces "
        "and run each with worker pods (docs/operator.md).",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        required=True,
        metavar="NS",
        help="a namespace to watch (repeatable)",
    )
    leader = parser.add_mutually_exclusive_group(required=True)
    leader.add_argument(
        "--peering", metavar="NAME", help="elect one active replica via this kopf peering"
    )
    leader.add_argument("--standalone", action="store_true", help="one replica, no peering")
    parser.add_argument(
        "--agent-image",
        default=os.environ.get(constants.ENV_AGENT_IMAGE, ""),
        metavar="IMAGE",
        help=f"worker pods' image unless a job sets pod.image (${constants.ENV_AGENT_IMAGE})",
    )
    _port(parser, "--store-port", constants.STORE_PORT, "first port of the jobs' stores (0: any)")
    _port(parser, "--health-port", constants.HEALTH_PORT, "liveness endpoint /healthz (0: none)")
    _port(parser, "--metrics-port", constants.METRICS_PORT, "Prometheus metrics (0: none)")
    parser.add_argument(
        "--reconcile-seconds",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between passes that replace dead worker pods",
    )
    parser.set_defaults(handler=run)


def _port(parser: argparse.ArgumentParser, flag: str, default: int, text: str) -> None:
    parser.add_argument(flag, type=int, default=default, metavar="P", help=text)


def run(args: argparse.Namespace) -> int:
    for flag in ("store_port", "health_port", "metrics_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            name = "--" + flag.replace("_", "-")
            raise OperatorCommandError(f"{name} {getattr(args, flag)}: give a port in [0, 65535]")
    if not args.reconcile_seconds > 0:
        raise OperatorCommandError(f"--reconcile-seconds {args.reconcile_seconds:g}: give S > 0")
    if not args.agent_image:
        raise OperatorCommandError(
            f"no agent image; give --agent-image or set {constants.ENV_AGENT_IMAGE}"
        )
    level = os.environ.get(constants.ENV_LOG_LEVEL, "info").lower()
    if level not in LOG_LEVELS:
        raise OperatorCommandError(
            f"{constants.ENV_LOG_LEVEL}={level!r}: give one of {', '.join(LOG_LEVELS)}"
        )
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=level.upper())
    asyncio.run(serve(args))
    return 0


def _priority() -> int:
    """This replica's kopf peering priority. kopf pauses *every* replica when several share the
    highest priority, so each gets its own: the earlier started, the higher. The oldest live
    replica works; the others pause and, in start order, take over when it goes."""
    return -(time.time_ns() // 1_000_000)


async def serve(args: argparse.Namespace, stop_flag: threading.Event | None = None) -> None:
    """Run the operator until `stop_flag` is set (or kopf's signal handlers stop it). kopf
    takes every task created after its start for its own, so it wants a loop of its own."""
    import kopf  # heavy: only when the operator runs

    from planaria.kube import api, exporter, handlers, jobs

    config = jobs.OperatorConfig(
        agent_image=args.agent_image,
        pod_ip=os.environ.get(constants.ENV_POD_IP) or "127.0.0.1",
        store_port=args.store_port,
    )
    running = jobs.Jobs(client=api.Api.from_environment(), config=config)
    server = None
    if args.metrics_port:
        server = exporter.serve(lambda: running.metrics.values(), args.metrics_port)
    try:
        await kopf.operator(
            registry=handlers.registry(reconcile_s=args.reconcile_seconds),
            settings=handlers.settings(
                peering=None if args.standalone else args.peering, priority=_priority()
            ),
            standalone=bool(args.standalone),
            peering_name=None if args.standalone else args.peering,
            namespaces=list(args.namespace),
            liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz"
            if args.health_port
            else None,
            memo=kopf.Memo(jobs=running),
            stop_flag=stop_flag,
        )
    finally:
        if server is not None:
            server.shutdown()
        running.client.close()
