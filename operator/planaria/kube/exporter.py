"""The operator's Prometheus endpoint: the metrics of every job it runs, on one port.

Each running job has a `planaria.control.metrics.MetricsSink` (its own registry, every series
labelled `job`); `JobsCollector` merges their families by name, so one scrape sees all jobs with
one HELP/TYPE line per metric, as the text format requires. A job's series go when its daemon
ends (the job ended, was deleted, or the operator hands it over).

Nothing here raises; `serve` fails with OSError when the port is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import metrics_core, registry

from planaria.control import metrics


class JobsCollector(registry.Collector):
    """Collects the families of every sink `sinks()` returns, merged by name."""

    def __init__(self, sinks: Callable[[], Iterable[metrics.MetricsSink]]) -> None:
        self._sinks = sinks

    def collect(self) -> Iterator[metrics_core.Metric]:
        merged: dict[str, metrics_core.Metric] = {}
        for sink in list(self._sinks()):
            for family in sink.registry.collect():
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = metrics_core.Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                into.samples.extend(family.samples)
        return iter(merged.values())


def serve(
    sinks: Callable[[], Iterable[metrics.MetricsSink]], port: int, addr: str = "0.0.0.0"
) -> WSGIServer:
    """Serve the jobs' metrics at http://addr:port/metrics; stop with `server.shutdown()`."""
    chosen = prometheus_client.CollectorRegistry(auto_describe=False)
    chosen.register(JobsCollector(sinks))
    server, _thread = prometheus_client.start_http_server(port, addr, registry=chosen)
    return server
