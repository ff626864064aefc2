#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with the pinned versions.
# An argument names an accelerator extra of setup.py: `scripts/setup.sh cuda`
# (NVIDIA GPUs, CUDA 13 drivers), `cuda12` or `tpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt -e ".[test${1:+,$1}]"
