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
        # The JAX stack within the releases tested (docs/index.md): requirements.txt's
        # pins on Python 3.11 and the newest on Python 3.12 and 3.13.
        'absl-py', 'chex>=0.1.92,<0.2', 'etils[epath]', 'flax>=0.12.8,<0.13',
        'jax>=0.10.2,<0.13', 'einops', 'grain>=0.2.18,<0.3', 'ml_collections',
        'numpy>=2.4,<3', 'opencv-python', 'optax>=0.2.8,<0.3',
        'orbax-checkpoint>=0.12.8,<0.13', 'pillow',
        'scipy>=1.17,<2', 'tensorflow-datasets>=4.9.10,<5', 'importlib_resources', 'tensorboard', 'matplotlib',
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
