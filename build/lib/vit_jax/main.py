"""`python -m vit_jax.main`: the original vit_jax's command line
(`vit_jax/original/main.py`)."""
from vit_jax.original.main import main, run  # noqa: F401

if __name__ == '__main__':
  run()
