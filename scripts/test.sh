#!/usr/bin/env bash
# Sets up the environment and runs the test suite, a worker per core (at most 4).
# Extra arguments go to pytest,
# e.g. `scripts/test.sh -m "not slow"` for the fast selection. The end-to-end tests
# (the documented commands and the notebooks run whole) are left out unless a
# selection is given: `scripts/test.sh -m e2e` runs them, and `.ci/run` runs both.
# `scripts/test.sh --python 3.13 ...` runs them on another Python, in .venv-3.13 with
# the newest releases it can have (scripts/setup.sh), TensorFlow and pandas
# unpinned, and no timm, transformers or PyTorch (the tests that compare with them
# are skipped, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --python ]; then
  scripts/setup.sh --python "$2"
  python=.venv-$2/bin/python
  shift 2
  "$python" -m pip install -q tensorflow-cpu pandas
else
  scripts/setup.sh
  python=.venv/bin/python
  # timm and PyTorch, for the comparisons with timm (requirements-timm.txt), and
  # TensorFlow, for the comparisons with its image operations and the original
  # vit_jax's notebooks, which import it (requirements-tensorflow.txt).
  "$python" -m pip install -q -r requirements-timm.txt -r requirements-tensorflow.txt
fi
scripts/get_data.sh
scripts/get_browser.sh
# A worker per core, at most 4 (each holds a few GB); a -n of the caller's comes later
# on the command line and wins.
workers=$(nproc)
exec "$python" -m pytest -m "not e2e" -n $(( workers < 4 ? workers : 4 )) "$@"
