#!/usr/bin/env bash
# The quick start: installs the project and the offline Fashion-MNIST, trains the
# small ViT and the small ResNet of configs/quickstart_{vit,resnet}.py into
# workdirs/quickstart_{vit,resnet}, then runs every analysis tool on the two
# into workdirs/analysis within 15 minutes (the costliest tools take smaller
# samples where their estimated time would exceed it; a tool that fails is named
# in the report and the others still run), ending with a summary (each model's
# steps, accuracy and wall time, the analysis time, the path of report.html, the
# CPU), which prints whatever the analysis did. Each trainer
# keeps to 15 minutes (--config.time_budget=15m: its schedule follows the clock,
# fewer steps on slower or busier CPUs). Extra arguments go to both trainers,
# e.g. --config.num_epochs=1. WORKDIRS=DIR puts the three directories in DIR
# instead of workdirs/ (benchmarks/quickstart_load.py uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${WORKDIRS:-workdirs}"
scripts/setup.sh
scripts/get_data.sh
for model in vit resnet; do
  train=(.venv/bin/python -m vit_jax.train --config "configs/quickstart_${model}.py"
         --workdir "$work/quickstart_${model}" --config.time_budget=15m "$@")
  trained=0
  "${train[@]}" || trained=$?
  # Exit status 75: the stall watchdog ended a run whose CPU devices waited at a
  # collective for one that never came (docs/reliability.md). Resume once, from its
  # last checkpoint, on one CPU device, where no collective can wait.
  if (( trained == 75 )); then
    echo "Resuming $model from its last checkpoint on one CPU device."
    trained=0
    "${train[@]}" --cpu_devices=1 || trained=$?
  fi
  (( trained == 0 )) || exit "$trained"
done
status=0
.venv/bin/python -m analysis all \
  --config configs/quickstart_vit.py --workdir "$work/quickstart_vit" \
  --config2 configs/quickstart_resnet.py --workdir2 "$work/quickstart_resnet" \
  --out "$work/analysis" --time_budget=15m || status=$?
.venv/bin/python scripts/summary.py "$work/quickstart_vit" "$work/quickstart_resnet" \
  --analysis "$work/analysis"
exit "$status"
