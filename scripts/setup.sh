#!/usr/bin/env bash
# Creates .venv (if missing) and installs the project with the pinned versions.
# An argument names an accelerator extra of setup.py: `scripts/setup.sh cuda`
# (NVIDIA GPUs, CUDA 13 drivers), `cuda12` or `tpu`. `scripts/setup.sh --python 3.13`
# makes .venv-3.13 on that Python instead (python3.13 on PATH, pyenv's included),
# with the newest releases setup.py's ranges allow there: the pins are Python 3.11's.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3 venv=.venv pins=(-r requirements.txt)
if [ "${1:-}" = --python ]; then
  python=python$2 venv=.venv-$2 pins=()
  if ! "$python" -c '' 2>/dev/null && command -v pyenv >/dev/null; then
    # pyenv's shim runs only the versions made global; its installed ones are here.
    installed=$(pyenv versions --bare | grep -E "^$2(\.[0-9]+)?$" | tail -1 || true)
    python=$(pyenv root)/versions/${installed:-$2}/bin/python$2
  fi
  shift 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "${pins[@]}" -e ".[test${1:+,$1}]"
