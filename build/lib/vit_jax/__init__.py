"""Vision Transformers and BiT ResNets in JAX/Flax, with checkpoint-exact parameter trees."""
