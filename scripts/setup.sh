#!/usr/bin/env bash
# Creates .venv (if missing) and installs Planaria with its test tools and the hf extra into it.
# torch 2.13.0 is installed first and on its own: an unpinned torch resolved with nothing
# installed pulls several GB of CUDA packages on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }
if ! .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "setup: installing torch 2.13.0 (CPU build)"
  pip install --quiet "torch==2.13.0"
fi
# The hf extra too: its tests (tokenizers, Parquet) run in CI; torch stays installed first.
echo "setup: installing planaria[test,hf] (editable)"
pip install --quiet -e ".[test,hf]"
