"""Data: the Grain input pipeline over TFDS datasets and image folders (`pipeline`),
its augmentations (`augment`), LiT's text tokenizers (`tokenizers`) and the datasets
the project ships (`datasets`: Fashion-MNIST's IDX files). It imports the zoo, never
the files or training.

The face holds the names the rest of the project uses (`vit_jax.faces`).
"""
from typing import TYPE_CHECKING

from vit_jax import faces

if TYPE_CHECKING:
  from vit_jax.data.augment import eval_resize, inception_crop, mirrored, resize, to_rgb
  from vit_jax.data.datasets.fashion_mnist_idx import FILES, FashionMnistIdx, read_idx
  from vit_jax.data.pipeline import (Batches, DataError, EXAMPLE_DRAWS, EpochOrder, Examples,
                                     FOLDER_PREFIX, RecordDecoder, Source, can_download,
                                     check_same_classes, eval_dataset, get_source, image_problem,
                                     model_input, one_hot, prefetch_to_devices, random_draws,
                                     read_image, train_dataset, unavailable)
  from vit_jax.data.tokenizers import (BertTokenizer, SentencepieceTokenizer, TOKENIZERS,
                                       get_tokenizer, tensorflow)

__getattr__, __dir__ = faces.names(__name__, {
    'augment': ('eval_resize', 'inception_crop', 'mirrored', 'resize', 'to_rgb'),
    'datasets.fashion_mnist_idx': ('FILES', 'FashionMnistIdx', 'read_idx'),
    'pipeline': ('Batches', 'DataError', 'EXAMPLE_DRAWS', 'EpochOrder', 'Examples',
                 'FOLDER_PREFIX', 'RecordDecoder', 'Source', 'can_download', 'check_same_classes',
                 'eval_dataset', 'get_source', 'image_problem', 'model_input', 'one_hot',
                 'prefetch_to_devices', 'random_draws', 'read_image', 'train_dataset',
                 'unavailable'),
    'tokenizers': ('BertTokenizer', 'SentencepieceTokenizer', 'TOKENIZERS', 'get_tokenizer',
                   'tensorflow'),
})
