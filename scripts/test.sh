#!/usr/bin/env bash
# Sets up the environment and runs the test suite. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not slow"` for the fast selection.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# timm and PyTorch, for the comparisons with timm (requirements-timm.txt).
.venv/bin/python -m pip install -q -r requirements-timm.txt
scripts/get_data.sh
scripts/get_browser.sh
exec .venv/bin/python -m pytest "$@"
