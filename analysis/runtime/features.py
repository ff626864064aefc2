"""Adapters between the model zoo and the analysis functions: a model with its
parameters (`Subject`), the names of its layers, its representations on batches
of a dataset, and token sequences put back on their 2-D grid.
"""
import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from analysis.runtime import progress
from vit_jax import data, files, models, training
from vit_jax.models.family import Family, Layers

TRAIN_AUGMENTED = 'train_augmented'  # the split name of training batches as the recipe draws them


def shard_examples(x: Any, axis: int = 0, mesh: Optional[Mesh] = None) -> jax.Array:
  """`x` split along its example axis over the devices, as the training mesh
  splits batches (the most devices that divide the axis; other axes whole), so
  that jitted analysis runs data-parallel and XLA does the reductions. With the
  `mesh` of split parameters (`Subject.mesh`), over that mesh: split where its
  devices divide the axis, else whole on each of them.

  Args:
    x: an array with an example axis.
    axis: that axis.
    mesh: the mesh of split parameters, or None for every device.

  Returns:
    `x` on the devices.
  """
  size = x.shape[axis]
  spec = [None] * x.ndim
  spec[axis] = training.AXIS
  if mesh is not None:
    return jax.device_put(x, NamedSharding(mesh, P(*spec) if size % mesh.size == 0 else P()))
  count = max(n for n in range(1, jax.device_count() + 1) if size % n == 0)
  return jax.device_put(x, NamedSharding(training.make_mesh(jax.devices()[:count]), P(*spec)))


@dataclasses.dataclass
class Subject:
  """A zoo model, its parameters and the image size it is analysed at."""
  label: str
  config: ml_collections.ConfigDict  # from models.get_config
  params: Any
  image_size: int
  recipe: Optional[ml_collections.ConfigDict] = None  # the training recipe, where known
  class_names: Tuple[str, ...] = ()  # of the data it is analysed on, where known
  mesh: Optional[Mesh] = None  # the mesh its parameters are split over (`split_parameters`)

  def class_name(self, label: int) -> str:
    """The name of class `label`, or 'class <label>' where names are unknown.

    Args:
      label: a class index.

    Returns:
      Its name.
    """
    return self.class_names[label] if label < len(self.class_names) else f'class {label}'
  _compiled: Dict[Tuple[str, ...], Any] = dataclasses.field(default_factory=dict, repr=False)

  @property
  def model(self):
    return models.build_model(self.config)

  @property
  def family(self) -> Family:
    return models.require(self.config, models.CLASSIFY)

  @property
  def layers(self) -> Layers:
    """The sown layers the tools read: residual stream, branches, attention."""
    return self.family.layers(self.config)

  @property
  def has_cls(self) -> bool:
    """Whether the token sequence starts with a class token."""
    return self.layers.class_token

  @property
  def registers(self) -> int:
    """How many registers follow the class token: tokens that are no patch."""
    return self.layers.registers

  @property
  def variables(self) -> Dict[str, Any]:
    """The variables the model is applied with at its fixed parameters
    (`models.fixed_variables`: the standardised kernels computed once), made
    again when `params` is replaced. Not for differentiating in `params`."""
    made = self._compiled.get(('variables',))
    if made is None or made['params'] is not self.params:
      made = models.fixed_variables(self.model, self.params, self.image_size)
      self._compiled[('variables',)] = made
    return made

  def parameter(self, path: str) -> jax.Array:
    """The parameter at a '/'-joined path, as `Layers` names them.

    Args:
      path: the path.

    Returns:
      The array.
    """
    node = self.params
    for key in path.split('/'):
      node = node[key]
    return node

  def token_grid(self) -> Tuple[Tuple[int, int], float]:
    """A token model's (h, w) grid of spatial tokens and the pixels each token spans."""
    first = self.layers.stream[0]
    shapes = self.intermediate_shapes([first])
    if shapes[first].ndim != 3:
      raise ValueError(f'{self.label} ({self.config.name}) has feature maps, not a token '
                       'sequence: token grids need a ViT or a Mixer.')
    tokens = shapes[first].shape[1] - int(self.has_cls) - self.registers
    side = int(round(np.sqrt(tokens)))
    return (side, side), self.image_size / side

  def intermediate_shapes(self, names: Sequence[str]) -> Dict[str, jax.ShapeDtypeStruct]:
    """The shapes of the named intermediates on one image, without computing them.

    Args:
      names: sown names.

    Returns:
      name -> its shape and dtype, the batch axis of size 1.
    """
    return jax.eval_shape(
        lambda p, x: models.apply_with_intermediates(
            self.model, {'params': p}, x, names=list(names))[1],
        self.params, jax.ShapeDtypeStruct((1, self.image_size, self.image_size, 3), jnp.float32))

  def intermediates(self, images: np.ndarray, names: Sequence[str]) -> Dict[str, jax.Array]:
    """The named intermediates on a batch; compiled once per set of names.

    Args:
      images: (B, H, W, 3) images.
      names: sown paths (`Layers` names them).

    Returns:
      {name: its array}.
    """
    key = tuple(names)
    if key not in self._compiled:
      model = self.model
      self._compiled[key] = jax.jit(lambda v, x: models.apply_with_intermediates(
          model, v, x, names=key)[1])
    return self._compiled[key](self.variables, shard_examples(images, mesh=self.mesh))

  def logits(self, images: np.ndarray) -> jax.Array:
    """The model's logits on a batch, compiled once.

    Args:
      images: (B, H, W, 3) images.

    Returns:
      The (B, classes) logits.
    """
    if ('logits',) not in self._compiled:
      self._compiled[('logits',)] = jax.jit(self.model.apply)
    return self._compiled[('logits',)](self.variables, shard_examples(images, mesh=self.mesh))

  def edited_logits(self, images: np.ndarray, edits: Dict[str, Any]) -> jax.Array:
    """The model's logits on a batch with what it sows edited: `edits` holds the
    `scales` and `shifts` collections (`vit_jax.models.family.sow_edited`).
    Compiled once per tree of edits.

    Args:
      images: (B, H, W, 3) images.
      edits: {collection name: its tree}.

    Returns:
      The (B, classes) logits.
    """
    if ('edited',) not in self._compiled:
      model = self.model
      self._compiled[('edited',)] = jax.jit(
          lambda variables, edits, x: model.apply({**variables, **edits}, x))
    return self._compiled[('edited',)](self.variables, edits,
                                       shard_examples(images, mesh=self.mesh))


def split_parameters(subject: Subject) -> Subject:
  """`subject` with its parameters split over every device as fully sharded
  training splits them (`vit_jax.training.sharding`, rule 'fsdp'): each device holds about
  1/n of them; batches and Lanczos vectors follow onto the same mesh. The
  computations are those of whole parameters, up to the order of float sums.

  Args:
    subject: the model.

  Returns:
    A copy whose parameters are split, with their `mesh`.
  """
  mesh = training.make_mesh()
  params = jax.device_put(subject.params, training.state_shardings(subject.params, mesh, 'fsdp'))
  return dataclasses.replace(subject, params=params, mesh=mesh, _compiled={})


def params_checksum(params: Any) -> str:
  """SHA-256 of the parameters' paths, shapes, dtypes and bytes: the same only for
  the same parameters (a model retrained in place under one name gets another).

  Args:
    params: a parameter tree.

  Returns:
    The hex digest.
  """
  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    array = np.asarray(leaf)
    digest.update(f'{jax.tree_util.keystr(path)}{array.shape}{array.dtype}'.encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def describe(subject: Subject, workdir: Optional[str] = None) -> Dict[str, Any]:
  """What the report says of a model: its family, architecture kind, shape in words,
  parameter count, image size, its recipe's tier (`tier`: 'quick-start',
  'paper-like') where it names one and, when it comes from a finished training workdir,
  the step and evaluation accuracy it ended with (the run's results.json).

  Args:
    subject: the model.
    workdir: the training workdir it comes from, or None.

  Returns:
    A JSON-able dict.
  """
  about = {'family': subject.family.name, 'model_name': subject.config.name,
           'architecture': subject.layers.architecture,
           'shape': subject.family.describe(subject.config),
           'parameters': int(sum(np.size(x) for x in jax.tree_util.tree_leaves(subject.params))),
           'params_checksum': params_checksum(subject.params),
           'image_size': subject.image_size}
  if subject.recipe is not None and subject.recipe.get('tier'):
    about['tier'] = subject.recipe.tier
  results = os.path.join(workdir, files.RESULTS) if workdir else None
  if results and os.path.exists(results):
    with open(results) as f:
      ended = json.load(f)
    about.update(steps=ended['step'], accuracy=ended['eval_accuracy'])
  return about


def attention_names(subject: Subject) -> Tuple[str, ...]:
  """The sown global attention maps of `subject`, one per layer.

  Args:
    subject: the model.

  Returns:
    Their sown paths.

  Raises:
    ValueError: the model sows none.
  """
  names = subject.layers.attention_weights
  if not names:
    raise ValueError(f'{subject.label} ({subject.config.name}) sows no global attention '
                     'weights over a token sequence; attention tools need a ViT.')
  return names


def layer_representations(subjects: Sequence[Subject], names: Sequence[Sequence[str]],
                          images: np.ndarray) -> List[jax.Array]:
  """Every subject's named layers on one batch, in order, as one flat list.

  Args:
    subjects: the models.
    names: each model's sown paths.
    images: one batch of images.

  Returns:
    The arrays, the first model's first.
  """
  reps = []
  for subject, layer_names in zip(subjects, names):
    inter = subject.intermediates(images, layer_names)
    reps += [inter[n] for n in layer_names]
  return reps


def tokens_to_grid(tokens: jax.Array, has_cls: bool, registers: int = 0) -> jax.Array:
  """(B, prefix + h*w, D) tokens -> (B, h, w, D) spatial map (square grids); the
  prefix is the class token and registers, where the model has them.

  Args:
    tokens: a token sequence.
    has_cls: its first token is a class token (dropped).
    registers: the number of registers after the class token (dropped).

  Returns:
    The map.
  """
  tokens = tokens[:, int(has_cls) + registers:]
  side = int(round(np.sqrt(tokens.shape[1])))
  if side * side != tokens.shape[1]:
    raise ValueError(f'{tokens.shape[1]} spatial tokens do not form a square grid.')
  return tokens.reshape(tokens.shape[0], side, side, tokens.shape[-1])


def spatial_map(subject: Subject, x: jax.Array) -> jax.Array:
  """A representation as a (B, h, w, C) map, whatever the family.

  Args:
    subject: the model.
    x: one of its representations: tokens or a map.

  Returns:
    The map.
  """
  return tokens_to_grid(x, subject.has_cls, subject.registers) if x.ndim == 3 else x


def load_subject(model_name: str, path: str, image_size: int, overrides: Optional[dict] = None,
                 label: Optional[str] = None,
                 recipe: Optional[ml_collections.ConfigDict] = None) -> Subject:
  """A model from a `.npz` (published or ours), a training workdir (its
  params.npz), a `transformers` folder, or a timm file of `model_name`
  (`.safetensors`, `.pth`, ...): each read as `checkpoint.load` reads it.

  The number of classes comes from the checkpoint's head (0 for a model published
  without one); `overrides` are the architecture fields of the recipe that
  trained it.

  Args:
    model_name: the zoo name.
    path: the `.npz` or the workdir.
    image_size: the side it is analysed at.
    overrides: the architecture fields.
    label: its label in the results (the model name if None).
    recipe: the recipe that trained it, for the tools that need its objective.

  Returns:
    The subject.
  """
  folder = os.path.isdir(path) and files.is_transformers_folder(path)  # read as files.load reads it
  if os.path.isdir(path) and not folder:  # a workdir's params.npz, or a download's weights
    path = files.weights_file(path)
  config = models.get_config(model_name, **(overrides or {}))
  family = models.require(config, models.CLASSIFY)
  if family.can(models.SCAN) and config.scan_layers:
    # the tools read what each block sows, under its own name
    config.scan_layers = False
  params = (files.load(path, config) if not folder and path.endswith(files.STATE_DICT_SUFFIXES)
            else files.load(path))
  flat = flax.traverse_util.flatten_dict(params, sep='/')
  head = [v for k, v in flat.items() if k.startswith(family.head) and k.endswith('kernel')]
  config.num_classes = int(head[0].shape[-1]) if head else 0
  expected = jax.eval_shape(models.build_model(config).init, jax.random.PRNGKey(0),
                            jnp.zeros((1, image_size, image_size, 3)))['params']
  files.check_matches(flat, flax.traverse_util.flatten_dict(expected, sep='/'), path)
  broken = files.non_finite(params)
  if broken:
    raise files.CheckpointError(
        f'{path} holds NaN or infinite parameters in {len(broken)} arrays (e.g. {broken[0]}): '
        'the run that wrote it diverged; analyse an earlier checkpoint.')
  return Subject(label or config.name, config, jax.tree_util.tree_map(jnp.asarray, params),
                 image_size, recipe)


def training_batches(recipe: ml_collections.ConfigDict, split: str, batch_size: int,
                     dataset: Optional[str] = None
                     ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
  """(images, label distributions) as the recipe trains on them: its training
  pipeline with its augmentation (crop or shifts, flips, RandAugment, mixup),
  seeded by the recipe, for one process on one device.

  Args:
    recipe: the training recipe.
    split: the split.
    batch_size: images per batch.
    dataset: a dataset instead of the recipe's.

  Returns:
    The batches.
  """
  source = data.get_source(dataset or recipe.dataset, split, recipe.data_dir)
  batches = data.train_dataset(
      source, batch_size=batch_size, image_size=recipe.image_size, seed=recipe.seed,
      process_count=1, local_devices=1, **recipe.input)
  for batch in batches:
    yield batch['image'], batch['label']


def dataset_batches(dataset: str, split: str, image_size: int, batch_size: int,
                    num_images: int, data_dir: Optional[str] = None
                    ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
  """(images, integer labels) in full batches, the first `num_images` of a split in
  order, preprocessed as for evaluation, for one process on one device. A last
  partial batch is dropped so every batch has one shape.

  Args:
    dataset: a TFDS name or `folder:` path.
    split: the split.
    image_size: the side images are resized to.
    batch_size: images per batch.
    num_images: how many images.
    data_dir: TFDS's data directory.

  Returns:
    The batches.
  """
  source = data.get_source(dataset, split, data_dir)
  if num_images > source.num_examples:
    raise ValueError(f'{dataset}:{split} has {source.num_examples} examples, fewer than the '
                     f'{num_images} asked for.')
  source = source.first(num_images)
  batches = data.eval_dataset(source, batch_size=batch_size, image_size=image_size,
                              process_count=1, local_devices=1)
  for batch in batches:
    if batch['mask'].all():
      yield batch['image'], batch['label'].argmax(-1)


def recipe_batches(recipe: ml_collections.ConfigDict, num_images: int, batch_size: int,
                   dataset: Optional[str] = None) -> Callable[[str], Iterator]:
  """The `batches(split)` the tools take, for a recipe (and `dataset` instead of
  its own): 'train' and 'eval', the first `num_images` of its splits preprocessed
  for evaluation, with integer labels; `TRAIN_AUGMENTED`, its training batches
  with augmentation and label distributions. A pass over a split that runs past
  `progress.REPORT_EVERY` seconds prints its progress.

  Args:
    recipe: the training recipe.
    num_images: images per split.
    batch_size: images per batch.
    dataset: a dataset instead of the recipe's.

  Returns:
    split -> its batches.
  """
  dataset = dataset or recipe.dataset
  splits = {'train': recipe.train_split, 'eval': recipe.eval_split}

  def reported(split: str) -> Iterator:
    done = progress.Progress(f'  {split} split', num_images // batch_size, 'batches')
    for batch in dataset_batches(dataset, splits[split], recipe.image_size, batch_size,
                                 num_images, recipe.data_dir):
      yield batch
      done.advance()  # after the tool has used the batch

  def batches(split: str) -> Iterator:
    if split == TRAIN_AUGMENTED:
      return training_batches(recipe, recipe.train_split, batch_size, dataset)
    return reported(split)
  return batches
