#!/usr/bin/env bash
# Sets up the environment and runs the test suite. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not slow"` for the fast selection.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/get_data.sh
scripts/get_browser.sh
exec .venv/bin/python -m pytest "$@"
