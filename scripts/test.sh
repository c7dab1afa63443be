#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, format and lint, types, import contracts, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
case "${PLANARIA_KUBE:-build}" in
  # The real Kubernetes control plane of tests/kube/real: built from Debian's packages the first
  # time (minutes), then reused from ~/.cache/planaria. Where it cannot be built, those tests are
  # skipped, saying why. PLANARIA_KUBE=skip does not build it (the tests run if it was built).
  build)
    echo "== kube control plane"
    if ! bash scripts/kube-control-plane.sh build; then
      echo "test: the Kubernetes control plane could not be built (above): tests/kube/real is skipped" >&2
    fi
    ;;
  skip) ;;
  *) echo "test: PLANARIA_KUBE must be build or skip, got '$PLANARIA_KUBE'" >&2; exit 2 ;;
esac
echo "== ruff"; ruff format --check . && ruff check .
echo "== mypy --strict"; mypy
echo "== import contracts"; lint-imports
if [ "${PLANARIA_IMAGE:-}" = build ]; then
  # The container image of tests/image (built with buildah once, then cached; needs root);
  # without it the image test is skipped.
  echo "== image"; bash scripts/build-image.sh build
fi
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
