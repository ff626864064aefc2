#!/usr/bin/env bash
# Sets up the environment and runs the test suite. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not slow"` for the fast selection.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/get_data.sh
scripts/get_browser.sh
# JAX's persistent compilation cache, shared by the test processes and the
# commands they start (which compile the same small models again and again),
# fresh for each run of the suite and removed after it. XLA's flags are part of
# its key, so runs with other flags never share a program.
if [ -z "${JAX_COMPILATION_CACHE_DIR:-}" ]; then
  JAX_COMPILATION_CACHE_DIR="$(mktemp -d -t vit_jax_tests_XXXXXX)"
  export JAX_COMPILATION_CACHE_DIR
  trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR"' EXIT
fi
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0.5}"
status=0
.venv/bin/python -m pytest "$@" || status=$?
exit "$status"
