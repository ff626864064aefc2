"""The path of the project's input pipeline (`vit_jax.data`: `get_source`,
`train_dataset`, `eval_dataset`, ...), and of the original vit_jax's names there
(`get_data`, `get_datasets`, ...: vit_jax/original/input_pipeline.py).
"""
from vit_jax import original
from vit_jax.data import (FOLDER_PREFIX, Batches, DataError, EpochOrder, Examples, RecordDecoder,
                          Source, can_download, check_same_classes, eval_dataset, get_source,
                          image_problem, model_input, one_hot, prefetch_to_devices, random_draws,
                          read_image, train_dataset, unavailable)

__getattr__ = original.forward(__name__)  # the original vit_jax's names (vit_jax/original/)
