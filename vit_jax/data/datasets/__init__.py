"""TFDS builders the project ships, for data that TFDS's own builders cannot read."""
from vit_jax.data.datasets.fashion_mnist_idx import FashionMnistIdx

# Offline builders standing in for the TFDS dataset of the same content.
OFFLINE = {'fashion_mnist': FashionMnistIdx}
