#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, format and lint, types, import contracts, tests.
#
# Two things the tests need are built from Debian's packages the first time (minutes), then
# reused from ~/.cache/planaria: the real Kubernetes control plane of tests/kube/real, and the
# container image of tests/image (buildah; needs root). Both are built (or found) in the
# background while ruff and mypy run. Where one cannot be built the command says why and goes on:
# its tests are then skipped, saying so. PLANARIA_KUBE=skip / PLANARIA_IMAGE=skip do not build
# them (their tests still run if they were built before).
set -euo pipefail
cd "$(dirname "$0")/.."
for choice in "PLANARIA_KUBE=${PLANARIA_KUBE:-build}" "PLANARIA_IMAGE=${PLANARIA_IMAGE:-build}"; do
  case "${choice#*=}" in
    build | skip) ;;
    *) echo "test: ${choice%%=*} must be build or skip, got '${choice#*=}'" >&2; exit 2 ;;
  esac
done
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
declare -A building=()
if [ "${PLANARIA_KUBE:-build}" = build ]; then
  bash scripts/kube-control-plane.sh build >"$logs/kube" 2>&1 &
  building[kube]=$!
fi
if [ "${PLANARIA_IMAGE:-build}" = build ]; then
  if [ "$(id -u)" = 0 ]; then
    bash scripts/build-image.sh build >"$logs/image" 2>&1 &
    building[image]=$!
  else
    echo "test: not root, so the image is not built (buildah needs root): tests/image skips"
  fi
fi

echo "== ruff"; ruff format --check . && ruff check .
echo "== mypy --strict"; mypy
echo "== import contracts"; lint-imports

for what in kube image; do
  [ -n "${building[$what]:-}" ] || continue
  if [ "$what" = kube ]; then title="the Kubernetes control plane"; skipped=tests/kube/real
  else title="the image"; skipped=tests/image; fi
  if wait "${building[$what]}"; then
    echo "== $title: $(tail -n 1 "$logs/$what")"
  else
    tail -n 20 "$logs/$what" >&2
    echo "test: $title could not be built (above): $skipped skips" >&2
  fi
done

echo "== pytest"
# One pytest worker per core (PLANARIA_TEST_WORKERS overrides; 0 runs in this process), a test
# file's tests on one worker so its module fixtures are built once. Most of the slow tests wait
# on processes they start (agents, controllers, timeouts), so two workers on two cores still
# take about a third off the wall time.
set +e
pytest -n "${PLANARIA_TEST_WORKERS:-auto}" --dist loadfile "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
