#!/usr/bin/env bash
# The paper-like tier (configs/papers.py): trains Park & Kim's ViT, ResNet-50 and
# AlterNet-50 layouts at their token grid into workdirs/papers/{vit,resnet,alternet},
# each within its recipe's 45-minute time budget; the two sweep rows the figure
# inventory reads (3x3 windows, global average pooling) at the ViT's steps into
# workdirs/papers/{window,pool}; and the ViT and the ResNet on 6% of the training
# data, also at the ViT's steps, into workdirs/papers/data. Then it runs every
# analysis tool on the ViT and the ResNet into workdirs/papers/analysis (within 30
# minutes), their Hessians at the end of warm-up and at the end into
# workdirs/papers/phases (within 25 minutes), the rows' analyses against the ViT into
# workdirs/papers/{window,pool}_analysis, the NLL of the 6% rows into
# workdirs/papers/data_analysis and the lesion study on the AlterNet and the ResNet
# into workdirs/papers/lesion, ending with the quick start's summary. Rerun it after
# a stop: a trained model is not trained again and an interrupted one resumes from
# its last checkpoint; the analyses run again. Extra arguments go to the three
# trainers; WORKDIRS=DIR puts papers/ in DIR instead of workdirs/.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${WORKDIRS:-workdirs}/papers"
scripts/setup.sh
scripts/get_data.sh
for model in vit resnet alternet; do
  .venv/bin/python -m vit_jax.train --config "configs/papers.py:${model}" \
    --workdir "$work/${model}" "$@"
done
# The sweep rows the figure inventory reads, each at the steps the ViT reached in its
# budget, so that rows compare at equal steps whatever the CPU's speed or load (one
# sweep's rows share their settings): 3x3 attention windows (Park & Kim's Fig. 5)
# and global average pooling (Raghu et al.'s Fig. 10) against the ViT; the ViT and
# the ResNet on 6% of the data (Park & Kim's Fig. 3: about 70 passes over its 3,600
# images, the figure's 67).
steps=$(.venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['step'])" \
  "$work/vit/results.json")
at_vit_steps=(--config.time_budget= --config.total_steps="$steps"
              --config.warmup_steps=$(( (steps + 30) / 60 )))
for sweep_rows in window:k3 pool:gap-lr0.001 data:vit-6%,resnet-6%; do
  .venv/bin/python -m vit_jax.sweep --config "configs/papers.py:${sweep_rows%%:*}" \
    --workdir "$work/${sweep_rows%%:*}" --rows "${sweep_rows#*:}" "${at_vit_steps[@]}"
done
status=0
.venv/bin/python -m analysis all \
  --config configs/papers.py:vit --workdir "$work/vit" \
  --config2 configs/papers.py:resnet --workdir2 "$work/resnet" \
  --out "$work/analysis" --time_budget=30m || status=$?
.venv/bin/python -m analysis hessian \
  --config configs/papers.py:vit --workdir "$work/vit" \
  --config2 configs/papers.py:resnet --workdir2 "$work/resnet" \
  --steps warmup,last --out "$work/phases" --time_budget=25m || status=$?
.venv/bin/python -m analysis hessian \
  --config configs/papers.py:window --row k3 --workdir "$work/window/k3" \
  --config2 configs/papers.py:vit --workdir2 "$work/vit" \
  --out "$work/window_analysis" --time_budget=15m || status=$?
.venv/bin/python -m analysis localisation \
  --config configs/papers.py:pool --row gap-lr0.001 --workdir "$work/pool/gap-lr0.001" \
  --config2 configs/papers.py:vit --workdir2 "$work/vit" --out "$work/pool_analysis" || status=$?
.venv/bin/python -m analysis nll \
  --config configs/papers.py:data --workdir "$work/data" --rows vit-6%,resnet-6% \
  --out "$work/data_analysis" || status=$?
.venv/bin/python -m analysis lesion \
  --config configs/papers.py:alternet --workdir "$work/alternet" \
  --config2 configs/papers.py:resnet --workdir2 "$work/resnet" \
  --out "$work/lesion" || status=$?
.venv/bin/python scripts/summary.py "$work/vit" "$work/resnet" "$work/alternet" \
  --analysis "$work/analysis"
exit "$status"
