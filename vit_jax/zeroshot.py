"""Zero-shot classification with a LiT model: class names into prompts, the text
tower's embeddings of them, and each image labelled with the most similar class.

    python -m vit_jax.zeroshot --model LiT-B16B --checkpoint LiT-B16B.npz \\
        --dataset cifar100 --split test

As the LiT authors' notebook does it: each class's embedding is the mean of its
prompts' normalised text embeddings (not normalised again), images are resized
to the model's size without cropping (`--crop` keeps the aspect ratio and
crops the centre) and scaled to [-1, 1], and the predicted class is the one of
highest dot product. Class names are the dataset's label names (TFDS) or
folder names (`folder:ROOT`), or one per line from `--classnames`. The
vocabulary is `<checkpoint stem>.txt` (BERT) or `.model` (SentencePiece) beside
the checkpoint, as the published files are laid out, unless `--vocab` names it.
"""
import json
import math
import os
import sys
from typing import Any, Dict, Iterable, Optional, Sequence

import flax
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from vit_jax import data, entry, files, models
from vit_jax.errors import ConfigError, DataError
from vit_jax.files import atomic_write
from vit_jax.models.family import CheckpointError

# The short list of CLIP's ImageNet prompts that the LiT notebook uses by default.
PROMPTS = ('itap of a {}.', 'a bad photo of the {}.', 'a origami {}.', 'a photo of the large {}.',
           'a {} in a video game.', 'art of the {}.', 'a photo of the small {}.', '{}')


def preprocess_image(image: np.ndarray, size: int, crop: bool = False) -> np.ndarray:
  """A uint8 (H, W, C) image as LiT's preprocessing gives it: bilinear resize to
  size x size (or of the short side to `size`, then the central crop), back to
  uint8 (truncating), then [-1, 1]. Grey images get three channels.

  Args:
    image: a uint8 (H, W, C) image.
    size: the output side.
    crop: resize the short side, then crop the centre.

  Returns:
    The (size, size, 3) float32 image.
  """
  image = data.eval_resize(data.to_rgb(image), size, size if crop else None)
  return image.astype(np.uint8).astype(np.float32) / np.float32(127.5) - 1


def default_vocab(checkpoint_path: str, config: ml_collections.ConfigDict) -> str:
  """The vocabulary beside a checkpoint: its stem with `.txt` (BERT) or `.model`.

  Args:
    checkpoint_path: the LiT checkpoint.
    config: its zoo config (its tokenizer).

  Returns:
    The vocabulary's path.
  """
  return os.path.splitext(checkpoint_path)[0] + models.lit.TOKENIZERS[config.tokenizer]


def load_params(path: str, model: Any, config: ml_collections.ConfigDict) -> Dict[str, Any]:
  """A LiT checkpoint's parameters, checked against the model's tree.

  Args:
    path: the checkpoint.
    model: the LiT module.
    config: its zoo config.

  Returns:
    The parameters.
  """
  params = files.load(path, config.name)
  images = jnp.zeros((1, config.image_size, config.image_size, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), images=images,
                                             tokens=jnp.ones((1, config.max_len), jnp.int32)))
  files.check_matches(flax.traverse_util.flatten_dict(params, sep='/'),
                      flax.traverse_util.flatten_dict(shapes['params'], sep='/'),
                      f'{path} (for {config.name})')
  return params


def _check_vocabulary(tokenizer: Any, params: Dict[str, Any], vocab: str, name: str) -> None:
  """Refuses a vocabulary with more tokens than the text tower's embedding table."""
  rows = models.lit.text_vocabulary(params)
  if tokenizer.vocab_size > rows:
    raise CheckpointError(f'The vocabulary {vocab} has {tokenizer.vocab_size} tokens but '
                          f"{name}'s text tower embeds {rows}: it is another model's "
                          'vocabulary.')


def class_embeddings(model: Any, params: Dict[str, Any], tokenizer: Any,
                     class_names: Sequence[str], prompts: Sequence[str],
                     batch_size: int = 256) -> np.ndarray:
  """(classes, D): for each class the mean of its prompts' text embeddings.

  Args:
    model: the LiT module.
    params: its parameters.
    tokenizer: the text tokenizer.
    class_names: the classes' names.
    prompts: templates with '{}' for the name.
    batch_size: texts per batch.

  Returns:
    The (classes, D) embeddings.
  """
  texts = [p.format(c) for c in class_names for p in prompts]
  embed = jax.jit(lambda v, t: model.apply(v, tokens=t)[1])
  tokens = tokenizer(texts)
  ztxt = np.concatenate([np.asarray(embed({'params': params}, tokens[i:i + batch_size]))
                         for i in range(0, len(texts), batch_size)])
  return ztxt.reshape(len(class_names), len(prompts), -1).mean(axis=1)


def classify(model: Any, params: Dict[str, Any], dataset: Iterable[Dict[str, np.ndarray]],
             zclasses: np.ndarray) -> Dict[str, Any]:
  """Predicted labels of `dataset`'s preprocessed image batches and the accuracy.

  Args:
    model: the LiT module.
    params: its parameters.
    dataset: batches of {'image', 'label'}.
    zclasses: the (classes, D) class embeddings.

  Returns:
    {'accuracy', 'num_examples', 'standard_error', 'predictions', 'labels'}.
  """
  embed = jax.jit(lambda v, x: model.apply(v, images=x)[0])
  predictions, labels = [], []
  for batch in dataset:
    zimg = np.asarray(embed({'params': params}, batch['image']))
    predictions.append((zimg @ zclasses.T).argmax(axis=1))
    labels.append(batch['label'])
  if not labels:
    raise DataError('The split holds no images to classify.')
  predictions, labels = np.concatenate(predictions), np.concatenate(labels)
  correct = predictions == labels
  return {'accuracy': float(correct.mean()), 'num_examples': int(len(labels)),
          'standard_error': float(np.sqrt(correct.mean() * (1 - correct.mean()) / len(labels))),
          'predictions': predictions, 'labels': labels}


def check_class_names(names: Sequence[str], where: str) -> None:
  """Refuses class names a choice between them cannot be made from: fewer than two,
  or one named twice (two classes with one text embedding).

  Args:
    names: the classes' names.
    where: where they come from, as the error names it.

  Raises:
    ConfigError: fewer than two names, or a name given twice.
  """
  if len(names) < 2:
    raise ConfigError(f'{where} gives {len(names)} class name(s): zero-shot classification '
                      'chooses between at least two classes.')
  seen = {}
  for i, name in enumerate(names):
    if name.strip().lower() in seen:
      raise ConfigError(f'{where} names {name!r} twice (classes {seen[name.strip().lower()]} and '
                        f'{i}): their prompts would embed alike; give each class its own name.')
    seen[name.strip().lower()] = i


def zero_shot(model_name: str, checkpoint_path: str, dataset: str, *, split: str = 'test',
              vocab: Optional[str] = None, data_dir: Optional[str] = None,
              class_names: Optional[Sequence[str]] = None,
              prompts: Sequence[str] = PROMPTS, crop: bool = False, batch_size: int = 64,
              max_examples: Optional[int] = None) -> Dict[str, Any]:
  """Zero-shot accuracy of a LiT checkpoint on a dataset split (see the module doc).

  Args:
    model_name: the LiT variant.
    checkpoint_path: its checkpoint.
    dataset: a TFDS name or `folder:` root.
    split: the split.
    vocab: the vocabulary (`default_vocab` if None).
    data_dir: TFDS's data directory.
    class_names: the classes' names (the dataset's if None).
    prompts: templates with '{}' for the name.
    crop: LiT's crop preprocessing.
    batch_size: images per batch.
    max_examples: the most images to classify.

  Returns:
    The accuracy and what it was measured on.
  """
  try:
    config = models.get_config(model_name)
    models.require(config, models.ZERO_SHOT)
  except ValueError as e:
    raise ConfigError(str(e)) from e
  if any('{}' not in p for p in prompts):
    raise ConfigError(f'Every prompt needs a {{}} for the class name: {list(prompts)}.')
  for name, value in (('batch_size', batch_size), ('max_examples', max_examples)):
    if value is not None and value < 1:
      raise ConfigError(f'--{name} is {value}; it must be at least 1.')
  if class_names is not None:
    check_class_names(class_names, '--classnames')
  model = models.build_model(config)
  params = load_params(checkpoint_path, model, config)
  vocab = vocab or default_vocab(checkpoint_path, config)
  tokenizer = data.get_tokenizer(config.tokenizer, vocab, config.max_len, model_name)
  _check_vocabulary(tokenizer, params, vocab, model_name)

  source = data.get_source(dataset, split, data_dir, process_index=0, process_count=1)
  names = list(class_names) if class_names is not None else list(source.class_names)
  check_class_names(names, f'{dataset} (its class names)')
  if len(names) != source.num_classes:
    raise ConfigError(f'{len(names)} class names for the {source.num_classes} classes of '
                      f'{dataset}: give one name per line, in label order.')
  if max_examples is not None:
    source = source.first(min(max_examples, source.num_examples))
  examples = source.examples

  def batch(index: int) -> Dict[str, np.ndarray]:
    chunk = examples.read(range(index * batch_size, min((index + 1) * batch_size, len(examples))))
    return {'image': np.stack([preprocess_image(ex['image'], config.image_size, crop)
                               for ex in chunk]),
            'label': np.array([ex['label'] for ex in chunk])}

  zclasses = class_embeddings(model, params, tokenizer, names, prompts)
  batches = grain.MapDataset.range(math.ceil(len(examples) / batch_size)).map(batch)
  result = classify(model, params, data.Batches(batches), zclasses)
  return dict(result, model=model_name, checkpoint=checkpoint_path, dataset=dataset, split=split,
              num_classes=len(names), prompts=list(prompts), crop=crop)


def main(argv: Sequence[str]) -> None:
  """Prints the zero-shot accuracy the flags ask for.

  Args:
    argv: the command line's arguments that are no flags (none).
  """
  del argv
  f = flags.FLAGS
  for name in ('model', 'checkpoint', 'dataset'):
    if getattr(f, name) is None:
      raise ConfigError(f'--{name} is required: python -m vit_jax.zeroshot --model LiT-B16B '
                        '--checkpoint LiT-B16B.npz --dataset cifar100.')
  class_names = None
  if f.classnames:
    if not os.path.isfile(f.classnames):
      raise ConfigError(f'--classnames {f.classnames} does not exist; give a text file with one '
                        'class name per line, in label order.')
    with open(f.classnames) as file:
      class_names = [line.strip() for line in file if line.strip()]
  result = zero_shot(f.model, f.checkpoint, f.dataset, split=f.split, vocab=f.vocab,
                     data_dir=f.data_dir, class_names=class_names,
                     prompts=tuple(f.prompt or PROMPTS), crop=f.crop, batch_size=f.batch_size,
                     max_examples=f.max_examples)
  print(f'{f.model} zero-shot on {f.dataset} {f.split}: {100 * result["accuracy"]:.2f}% '
        f'± {100 * result["standard_error"]:.2f} ({result["num_examples"]} images, '
        f'{result["num_classes"]} classes, {len(result["prompts"])} prompts)')
  if f.results:
    summary = {k: v for k, v in result.items() if k not in ('predictions', 'labels')}
    with atomic_write(f.results, 'w') as file:
      json.dump(summary, file, indent=1)
  sys.stdout.flush()


def define_flags() -> None:
  """The command's flags, defined only when it runs: the module is also a library
  imported beside other commands' flags (`--checkpoint` is the analysis's too)."""
  flags.DEFINE_string('model', None, 'A LiT model name, e.g. LiT-B16B.')
  flags.DEFINE_string('checkpoint', None, 'The LiT .npz (gs://vit_models/lit/<model>.npz).')
  flags.DEFINE_string('vocab', None, 'The tokenizer vocabulary; default: beside the checkpoint.')
  flags.DEFINE_string('dataset', None, 'A TFDS name or folder:ROOT (ROOT/<split>/<class>/*).')
  flags.DEFINE_string('split', 'test', 'The split to classify.')
  flags.DEFINE_string('data_dir', None, 'TFDS data directory.')
  flags.DEFINE_string('classnames', None, 'A text file with one class name per line, in label '
                      'order (e.g. readable ImageNet names); default: the dataset\'s own.')
  flags.DEFINE_multi_string('prompt', None, 'A prompt template with {} for the class name; '
                            'repeat for several. Default: the LiT notebook\'s 8 prompts.')
  flags.DEFINE_bool('crop', False, 'Resize the short side and crop the centre instead of '
                    'resizing to a square.')
  flags.DEFINE_integer('batch_size', 64, 'Images per batch.')
  flags.DEFINE_integer('max_examples', None, 'Classify only the first n images.')
  flags.DEFINE_string('results', None, 'Write the accuracy and settings to this JSON file.')


if __name__ == '__main__':
  define_flags()
  entry.run(main, config_flags=())
