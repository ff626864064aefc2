"""vit_jax: Vision Transformers and BiT ResNets in JAX/Flax, and tools to analyse them."""
import setuptools

setuptools.setup(
    name='vit_jax',
    version='0.1.0',
    description='Vision Transformers and BiT ResNets in JAX/Flax with checkpoint-exact parameters.',
    packages=setuptools.find_packages(include=['vit_jax', 'vit_jax.*', 'configs', 'analysis',
                                               'analysis.*']),
    python_requires='>=3.10',
    install_requires=[
        'absl-py', 'chex>=0.1.86', 'etils[epath]', 'flax>=0.10', 'jax>=0.4.30',
        'einops', 'grain', 'ml_collections', 'numpy', 'opencv-python', 'optax',
        'orbax-checkpoint', 'pillow',
        'scipy', 'tensorflow-datasets', 'importlib_resources', 'tensorboard', 'matplotlib',
        'safetensors', 'threadpoolctl',
    ],
    extras_require={
        # The corruption tool's ImageNet-C corruptions (the build for current numpy).
        'corruptions': ['imagecorruptions-imaug'],
        # LiT's SentencePiece vocabularies.
        'lit': ['sentencepiece'],
        'test': ['pytest', 'pytest-xdist', 'hypothesis', 'filelock', 'nbclient', 'nbformat',
                 'ipykernel', 'mkdocs', 'mkdocs-material', 'mkdocstrings[python]',
                 'imagecorruptions-imaug', 'sentencepiece'],
        # Accelerators: JAX's own builds for NVIDIA GPUs (CUDA 13 or 12 drivers) and TPUs.
        'cuda': ['jax[cuda13]'],
        'cuda12': ['jax[cuda12]'],
        'tpu': ['jax[tpu]'],
    },
)
