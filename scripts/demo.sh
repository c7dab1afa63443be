#!/usr/bin/env bash
# The main job, locally: a tiny GPT trained by 8 worker processes through two injected failures
# (examples/tiny-job.yaml). Installs into .venv first if needed (as scripts/setup.sh does), then
# shows live progress and writes the report to runs/demo/ (docs/running.md). Extra arguments go
# to `planaria run`, e.g. `bash scripts/demo.sh --no-progress`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c 'import planaria.cli.run' 2>/dev/null; then
  bash scripts/setup.sh
fi
exec .venv/bin/planaria run examples/tiny-job.yaml --out runs/demo "$@"
