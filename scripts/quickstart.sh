#!/usr/bin/env bash
# The quick start: installs the project and the offline Fashion-MNIST, then trains
# the small ViT of configs/quickstart_vit.py into workdirs/quickstart_vit.
# Extra arguments go to the trainer, e.g. --config.num_epochs=1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/get_data.sh
exec .venv/bin/python -m vit_jax.train --config configs/quickstart_vit.py \
  --workdir workdirs/quickstart_vit "$@"
