"""Prometheus metrics of a job, drawn from its status: a `ports.StatusSink`, and its endpoint.

`MetricsSink` keeps its own `CollectorRegistry` (never the process-wide default, so two jobs or
two tests never share series) and updates it from every status the controller publishes:

    planaria_step                     last committed step
    planaria_samples_per_second       training throughput at that step
    planaria_live_workers             workers training in the current plan
    planaria_total_workers            workers the job asked for
    planaria_epoch                    configuration generation
    planaria_phase{phase}             1 for the job's phase, 0 for the others
    planaria_recoveries_total{tier,kind}   recoveries finished, by costliest tier and kind
    planaria_recovery_seconds         histogram of recoveries' total seconds (death to step)
    planaria_lost_steps_total         committed steps trained again after recoveries

A status carries only the latest recovery; recoveries finishing between two publishes (the
controller publishes every pass, so this needs two recoveries within one heartbeat interval)
are all counted under the latest one's labels.

`serve` exposes a sink's registry over HTTP (prometheus_client's server, a daemon thread).
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

import prometheus_client

from planaria.control import status as statuses

# Recovery times span a local regroup (tens of ms) to a cluster restart (minutes).
RECOVERY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class MetricsSink:
    """A StatusSink that updates Prometheus metrics (module docstring)."""

    def __init__(self, job: str) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = {"job": job}
        self._step = self._gauge("planaria_step", "Last committed step", labels)
        self._rate = self._gauge(
            "planaria_samples_per_second", "Training throughput (samples/s)", labels
        )
        self._live = self._gauge("planaria_live_workers", "Workers training in the plan", labels)
        self._total = self._gauge("planaria_total_workers", "Workers the job asked for", labels)
        self._epoch = self._gauge("planaria_epoch", "Configuration generation", labels)
        self._phase = prometheus_client.Gauge(
            "planaria_phase", "1 for the job's phase", ["job", "phase"], registry=self.registry
        )
        self._recoveries = prometheus_client.Counter(
            "planaria_recoveries",
            "Recoveries finished, by costliest tier and kind",
            ["job", "tier", "kind"],
            registry=self.registry,
        )
        self._seconds = prometheus_client.Histogram(
            "planaria_recovery_seconds",
            "Seconds from a death to the first step of the recovered epoch",
            ["job"],
            buckets=RECOVERY_BUCKETS_S,
            registry=self.registry,
        ).labels(**labels)
        self._lost = prometheus_client.Counter(
            "planaria_lost_steps", "Committed steps trained again", ["job"], registry=self.registry
        ).labels(**labels)
        self._job = job
        self._seen = 0

    def _gauge(self, name: str, doc: str, labels: dict[str, str]) -> prometheus_client.Gauge:
        gauge = prometheus_client.Gauge(name, doc, list(labels), registry=self.registry)
        return gauge.labels(**labels)

    async def publish(self, status: statuses.JobStatus) -> None:
        """Update the metrics from `status`."""
        self.update(status)

    def update(self, status: statuses.JobStatus) -> None:
        self._step.set(status.step)
        self._rate.set(status.samples_per_s)
        self._live.set(status.live_workers)
        self._total.set(status.total_workers)
        self._epoch.set(status.epoch)
        for phase in statuses.Phase:
            self._phase.labels(job=self._job, phase=phase.value).set(phase is status.phase)
        new = status.recoveries - self._seen
        last = status.last_recovery
        if new > 0 and last is not None:
            self._recoveries.labels(job=self._job, tier=last.tier.value, kind=last.kind).inc(new)
            for _ in range(new):
                self._seconds.observe(last.total_s)
            self._lost.inc(last.lost_steps * new)
        self._seen = status.recoveries


def serve(sink: MetricsSink, port: int, addr: str = "127.0.0.1") -> WSGIServer:
    """Serve the sink's metrics at http://addr:port/metrics (port 0: any free port, read it
    from `server.server_port`); stop with `server.shutdown()` and `server.server_close()`."""
    server, _thread = prometheus_client.start_http_server(port, addr, registry=sink.registry)
    return server
