"""`planaria operator`'s options, kopf settings and the metrics endpoint, without a cluster.

Covered: bad options fail with one line naming the option (a port out of range, no agent
image, a non-positive reconcile interval, neither --peering nor --standalone); kopf's settings
(our finalizer and annotation prefix, no cluster-wide scanning, standalone or peering with
the given name); the Prometheus endpoint serves every job's series under one HELP/TYPE per
metric, over real HTTP; the log level comes from the chart's env variable.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from planaria.cli import main, operator
from planaria.control import metrics
from planaria.control import status as statuses
from planaria.kube import constants, exporter, handlers

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--store-port", "70000"], "--store-port 70000: give a port in [0, 65535]"),
        (["--agent-image", ""], "no agent image; give --agent-image"),
        (["--reconcile-seconds", "0"], "--reconcile-seconds 0: give S > 0"),
    ],
    ids=["a port out of range", "no image", "no reconcile interval"],
)
def test_bad_options_fail_with_one_line(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["operator", "--namespace", "ml", "--standalone", "--agent-image", "i", *flags]
    assert main.main(argv) == main.EXIT_USAGE
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_bad_log_level_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(constants.ENV_LOG_LEVEL, "loud")
    argv = ["operator", "--namespace", "ml", "--standalone", "--agent-image", "i"]
    assert main.main(argv) == main.EXIT_USAGE
    err = capsys.readouterr().err
    assert "PLANARIA_LOG_LEVEL='loud': give one of debug, info, warning, error" in err


def test_the_log_levels_are_the_charts() -> None:
    schema = json.loads((ROOT / "charts/planaria/values.schema.json").read_text())
    assert tuple(schema["properties"]["logLevel"]["enum"]) == operator.LOG_LEVELS


def test_one_of_peering_or_standalone_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main.main(["operator", "--namespace", "ml", "--agent-image", "i"])
    assert "--peering" in capsys.readouterr().err


@pytest.mark.parametrize("peering", [None, "planaria"], ids=["standalone", "peering"])
def test_kopf_settings_use_our_names(peering: str | None) -> None:
    chosen = handlers.settings(peering=peering)
    assert chosen.persistence.finalizer == constants.FINALIZER
    assert chosen.scanning.disabled is True
    assert chosen.peering.standalone is (peering is None)
    assert chosen.peering.mandatory is (peering is not None)
    if peering:
        assert chosen.peering.name == peering


def test_the_metrics_endpoint_serves_every_job_once_per_metric() -> None:
    sinks = [metrics.MetricsSink("ml/a"), metrics.MetricsSink("ml/b")]
    for step, sink in enumerate(sinks, start=3):
        sink.update(
            statuses.compute(
                statuses.View(
                    phase=statuses.Phase.RUNNING,
                    epoch=1,
                    step=step,
                    loss=None,
                    samples_per_s=1.0,
                    live_workers=2,
                    total_workers=2,
                    plan=None,
                    plan_kind=statuses.MoveKind.INITIAL,
                    recoveries=(),
                    message="",
                )
            )
        )
    server = exporter.serve(lambda: sinks, 0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'planaria_step{job="ml/a"} 3.0' in text
    assert 'planaria_step{job="ml/b"} 4.0' in text
    assert text.count("# TYPE planaria_step gauge") == 1
