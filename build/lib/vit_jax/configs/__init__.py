"""The original vit_jax's configs, as its users name them: `models` (every
published architecture by name), `common` (the fine-tuning defaults and dataset
presets), and the command-line configs `vit.py`, `augreg.py`,
`mixer_base16_cifar10.py` and `inference_time.py` for `python -m vit_jax.main`.
The project's own recipes are the top-level `configs/` (docs/original.md)."""
