"""The example scripts in examples/ run as documented and print what they promise."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_planning_a_gpu_cluster_ends_with_a_recovery_decision() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "examples" / "plan-a-gpu-cluster.sh")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "templates (Oobleck §4.1)" in result.stdout
    assert "recovery policy (Odyssey eq. 8)" in result.stdout
    assert "\nchose " in result.stdout
