#!/usr/bin/env bash
# Sets up the environment and runs the test suite. Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not slow"` for the fast selection. The end-to-end tests
# (the documented commands and the notebooks run whole) are left out unless a
# selection is given: `scripts/test.sh -m e2e` runs them, and `.ci/run` runs both.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# timm and PyTorch, for the comparisons with timm (requirements-timm.txt), and
# TensorFlow, for the comparisons with its image operations and the original
# vit_jax's notebooks, which import it (requirements-tensorflow.txt).
.venv/bin/python -m pip install -q -r requirements-timm.txt -r requirements-tensorflow.txt
scripts/get_data.sh
scripts/get_browser.sh
exec .venv/bin/python -m pytest -m "not e2e" "$@"
