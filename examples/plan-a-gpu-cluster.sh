#!/usr/bin/env bash
# Plan GPT-3 2.7B on 10 nodes of 4 A100-80GB GPUs that must survive one pipeline failure, then
# see what Planaria would do when nodes 3 and 7 fail and the next failure is expected in an hour.
#
#   bash examples/plan-a-gpu-cluster.sh        (after bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
planaria=.venv/bin/planaria
profile=$(mktemp --suffix=.json)
trap 'rm -f "$profile"' EXIT

# An analytic profile from the model's shapes and the accelerator's datasheet numbers; its
# assumptions are written into the file (see docs/profile-format.md).
"$planaria" profile --synthetic gpt3-2.7b --accelerator a100-80gb --micro-batch 1 \
  --gpus-per-node 4 --out "$profile"

# Oobleck templates, the chosen heterogeneous plan and batch split; after the failures, the
# reinstantiated plan and Odyssey's choice between rerouting and re-planning, with its reason.
"$planaria" plan --profile "$profile" --nodes 10 --gpus-per-node 4 --fault-tolerance 1 \
  --global-batch 512 --micro-batch 1 --failed 3,7 --explain --mtbf 3600
