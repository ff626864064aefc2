"""What the rest of the project knows about a model family, said by the family.

Each family module (`vit`, `resnet`, `mixer`, `alternet`, `lit`) exports one
`Family`: its published variants, how to configure and build them, what they
can do (`capabilities`), the layers they sow, the classifier head and how a
published checkpoint is fitted to a new task. Training, checkpoints and
analysis read these and never test a family name.
"""
import dataclasses
import logging
import re
from typing import (Any, Callable, Collection, Dict, FrozenSet, List, Mapping, Optional,
                    Sequence, Tuple)

import flax
import flax.linen as nn
import ml_collections
import numpy as np

from vit_jax.errors import UserError

Flat = Dict[str, Any]  # '/'-joined parameter paths -> arrays

log = logging.getLogger(__name__)

# What the papers call a model, for the claims they make about each kind.
TRANSFORMER = 'transformer'  # attention and MLP blocks on patch tokens (ViT)
CONVNET = 'convnet'  # convolutions only (ResNet)
HYBRID = 'hybrid'  # convolutions and attention together (hybrid ViT, AlterNet)
MLP = 'mlp'  # MLPs that mix tokens (Mixer)

# What a family's models can do, each declared in `Family.capabilities`, with what
# it means to a user (for the sentence that refuses a model lacking it).
CLASSIFY = 'classify'
ZERO_SHOT = 'zero-shot'
SCAN = 'scan'
TENSOR_PARALLEL = 'tensor-parallel'
CAPABILITIES = {
    CLASSIFY: 'classify images (train and fine-tune it with vit_jax.train)',
    ZERO_SHOT: 'classify images zero-shot from class names (vit_jax.zeroshot)',
    SCAN: 'run its blocks as one scan (scan_layers=True)',
    TENSOR_PARALLEL: 'split its heads and hidden units over a model axis (config.model_parallel)',
}


class CheckpointError(UserError, ValueError):
  """A checkpoint file that cannot be read or does not fit the model."""


@dataclasses.dataclass(frozen=True)
class Branch:
  """One residual branch: the stream `skip` enters it, `output` is what it adds."""
  label: str  # e.g. 'block3/attention'
  kind: str  # what the branch computes: 'attention', 'mlp', 'conv', 'token mixing', ...
  skip: str  # sown name of the branch input z
  output: str  # sown name of the branch output f(z)


@dataclasses.dataclass(frozen=True)
class Layers:
  """What one configured model sows, by name: its residual stream, branches,
  attention maps and pre-logits, and where its stages begin. Anything that reads
  a model's intermediates (`models.apply_with_intermediates`) reads them through
  this description instead of spelling a family's module paths."""
  stream: Tuple[str, ...]  # the residual stream, input to output
  labels: Tuple[str, ...]  # a short label per stream entry
  attention: Tuple[int, ...]  # stream indices right after an attention branch
  branches: Tuple[Branch, ...]  # every residual branch, in depth order
  attention_weights: Tuple[str, ...]  # global (B, heads, T, T) attention maps over the tokens
  pre_logits: str  # the features the head reads
  class_token: bool  # token sequences start with a class token
  registers: int = 0  # tokens after the class token (if any) and before the patches
  stages: Tuple[int, ...] = ()  # stream indices where a new stage begins
  branch_stages: Tuple[int, ...] = ()  # branch indices where a new stage begins
  embedding: Optional[str] = None  # parameter path of the patch-embedding kernel
  # The sown output of the patch embedding, (B, patches, D), before positions are added.
  patch_tokens: Optional[str] = None
  position_embedding: Optional[str] = None  # parameter path of a learned 1-D position table
  architecture: str = TRANSFORMER  # TRANSFORMER, CONVNET, HYBRID or MLP
  # Per global attention map, its heads' outputs (B, T, heads, D/heads) before the
  # output projection.
  head_outputs: Tuple[str, ...] = ()


# Variable collections that edit what a model sows, keyed as the sown names (in
# the sowing module's scope): a sown value y becomes y * scale + shift where
# `apply` is given an entry for it. Scales of 0 remove a residual branch or a
# head (lesions, ablations); a shift then puts another value in its place (mean
# ablation, activation patching, the logit lens). Without them a model computes
# what it always does.
SCALES = 'scales'
SHIFTS = 'shifts'


def sow_edited(module: nn.Module, name: str, y: Any) -> Any:
  """`y` as the `scales` and `shifts` collections edit it under `name` (each
  broadcast against `y`, where `apply` is given it), sown as `name`. Families
  sow every residual stream entry, residual branch output and attention head
  output through it.

  Args:
    module: the module that sows it.
    name: the sown name.
    y: the value.

  Returns:
    The edited value, which the model goes on with.
  """
  if module.has_variable(SCALES, name):
    y = y * module.get_variable(SCALES, name).astype(y.dtype)
  if module.has_variable(SHIFTS, name):
    y = y + module.get_variable(SHIFTS, name).astype(y.dtype)
  module.sow('intermediates', name, y)
  return y


def branch_scales(layers: 'Layers') -> Dict[str, Any]:
  """The `scales` collection with scale 1 for every branch of `layers`
  (nested by the branches' sown paths); set one to 0 to remove that branch. Every
  choice has the same tree, so that a compiled model serves them all.

  Args:
    layers: the model's description.

  Returns:
    The collection.
  """
  return flax.traverse_util.unflatten_dict(
      {tuple(b.output.split('/')): np.float32(1.) for b in layers.branches})


def stage_starts(stage_of: Sequence[Any]) -> Tuple[int, ...]:
  """The indices where the stage (a value per entry) differs from the entry before.

  Args:
    stage_of: each entry's stage.

  Returns:
    The indices.
  """
  return tuple(i for i in range(1, len(stage_of)) if stage_of[i] != stage_of[i - 1])


def override(config: Dict[str, Any], overrides: Mapping[str, Any],
             nested: Collection[str] = ()) -> Dict[str, Any]:
  """A model config with fields replaced, or for the `nested` ones (dicts of a
  tower's fields) updated; a field the config lacks is refused.

  Args:
    config: the config's fields, `family` and `name` among them.
    overrides: the fields to set.
    nested: fields whose overrides update the dict they hold.

  Returns:
    `config`, changed.

  Raises:
    ValueError: a field the config lacks, naming those it has.
  """
  settable = set(config) - {'family', 'name'}
  unknown = sorted(set(overrides) - settable)
  if unknown:
    raise ValueError(f'{config["name"]} has no field(s) {unknown}; the fields you can set are: '
                     f'{", ".join(sorted(settable))}.')
  for key, value in overrides.items():
    config[key] = dict(config[key], **value) if key in nested else value
  return config


@dataclasses.dataclass
class Fit:
  """A checkpoint being fitted to a new model, rule by rule (`Family.fit`).

  Each rule changes `restored` towards the keys and shapes of `init`: it resizes
  an array, takes one from `init`, or drops one the new model has no place for
  (`drop`, with the reason the warning gives).
  """
  restored: Flat  # the checkpoint's flat parameters, changed by each rule
  init: Flat  # the new model's freshly initialised flat parameters
  config: ml_collections.ConfigDict  # the new model's zoo config
  grid_shape: Optional[Sequence[int]]  # the new patch grid, None when inferred
  source: str  # the checkpoint's path, for messages
  head: str  # the family's head prefix (`Family.head`)
  keep_head: bool = False  # keep the checkpoint's head (a second stage on the same classes)
  dropped: Dict[str, List[str]] = dataclasses.field(default_factory=dict)  # reason -> keys

  def drop(self, keys: Sequence[str], why: str) -> None:
    """Removes `keys` (those present) from `restored`, naming them under `why`.

    Args:
      keys: the keys.
      why: what the new model has instead, for the warning ('no registers').
    """
    for key in keys:
      if key in self.restored:
        self.dropped.setdefault(why, []).append(key)
        del self.restored[key]

  def from_init(self, prefix: str) -> None:
    """Takes from `init` every array under `prefix` that `restored` lacks.

    Args:
      prefix: a parameter-path prefix ('MAPHead_0/').
    """
    self.restored.update({k: v for k, v in self.init.items()
                          if k.startswith(prefix) and k not in self.restored})


FitRule = Callable[[Fit], None]


def new_head(fit: Fit) -> None:
  """The new model's head in place of the checkpoint's (a new task's classes),
  unless `keep_head`: the rule every family's fit starts with. A family without a
  head (`Family.head` empty) keeps every array."""
  if fit.keep_head or not fit.head:
    return
  fit.restored = {k: v for k, v in fit.restored.items() if not k.startswith(fit.head)}
  fit.from_init(fit.head)


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: published variants, what they can do, module, sown layers,
  head, fine-tuning.

  `fit_rules` fit a published checkpoint to a new model (`Family.fit`), in order:
  each is one named rule (a new head, the patches, the position embeddings,
  registers) that changes a `Fit` towards the new model's keys and shapes or
  refuses the checkpoint with a CheckpointError. A family joins the zoo with `models.register(FAMILY)`; the test suite
  runs on its `tiny` model every test parametrised over the families that can
  do what the test needs.

  `make_config(fields, overrides)` makes a variant's config: `fields` are its
  architecture fields with `family`, `name`, the family's `defaults` and `dtype`,
  or a config it made before (`models.with_fields`); the default replaces fields
  by the overrides (`override`).
  """
  name: str
  title: str  # how people call the family's models: 'ViT, hybrid', 'BiT', ...
  variants: Mapping[str, Mapping[str, Any]]  # published name -> architecture fields
  module: Callable[..., nn.Module]  # a config's fields but `family` and `name` -> module
  describe: Callable[[ml_collections.ConfigDict], str]  # the shape in words: '4 blocks, width 64'
  # A published variant and the fields that make it tiny (a few ten thousand
  # parameters at 32 px): the model the test suite runs this family on.
  tiny: Tuple[str, Mapping[str, Any]]
  capabilities: FrozenSet[str] = frozenset({CLASSIFY})  # keys of CAPABILITIES
  # What an image classifier sows: its residual stream, branches, attention, ...
  layers: Optional[Callable[[ml_collections.ConfigDict], Layers]] = None
  head: str = ''  # parameter-path prefix of the classifier, re-initialised for a new task
  defaults: Mapping[str, Any] = dataclasses.field(
      default_factory=lambda: {'num_classes': 1000})  # fields every variant takes besides
  make_config: Callable[[Dict[str, Any], Mapping[str, Any]], Dict[str, Any]] = override
  fit_rules: Tuple['FitRule', ...] = ()  # after `new_head`, which every family's fit starts with
  # Whether a flat tree is this family's, in a layout its `to_published` reads (a
  # ViT's in big_vision's, a LiT file's two towers); the one family that owns a tree
  # reads it (`layout.published`). A family whose files have only the published
  # layout need own none.
  owns: Callable[[Flat], bool] = lambda flat: False
  # A flat tree the family owns (current-Flax block names, big_vision) under the
  # published names.
  to_published: Callable[[Flat], Flat] = dict
  # A published-layout tree in the tree of the module of a config (the inverse
  # of `to_published` for a module whose tree differs: a ViT scanning its blocks).
  module_layout: Callable[[Flat, ml_collections.ConfigDict], Flat] = (
      lambda flat, config: dict(flat))
  # A published-layout flat tree and its model's config -> timm's state dict.
  to_timm: Optional[Callable[[Flat, ml_collections.ConfigDict], Dict[str, Any]]] = None
  # From a timm state dict and the named model's config: the fields the state dict
  # fixes (head, classes) and the `image_size` its position embeddings are for.
  timm_fields: Optional[Callable[[Mapping[str, Any], ml_collections.ConfigDict],
                                 Dict[str, Any]]] = None
  # Hugging Face `transformers` folders (`vit_jax.files.hf_files`): the model types the
  # family reads; a config.json -> the fields it sets (refusing one it cannot
  # express); the weights (the files' names) and the config.json -> (timm's names, extra published
  # parameters timm has no place for, the fields those extra parameters fix); and
  # back, (the published parameters, flat, the model's config, image size, the
  # model type to write or None) -> (config.json, the weights under the files' names).
  transformers_types: Tuple[str, ...] = ()
  transformers_fields: Optional[Callable[[Mapping[str, Any]], Dict[str, Any]]] = None
  from_transformers: Optional[Callable[[Mapping[str, Any], Mapping[str, Any]],
                                       Tuple[Dict[str, Any], Flat, Dict[str, Any]]]] = None
  to_transformers: Optional[Callable[..., Tuple[Dict[str, Any], Dict[str, Any]]]] = None
  # (regex of a parameter path's end, its axis counted from the end) that a mesh's
  # model axis splits: heads and hidden units, for tensor parallelism.
  tensor_parallel: Tuple[Tuple[str, int], ...] = ()
  sequence_fields: Tuple[str, ...] = ()  # fields passed to the module as tuples

  def can(self, capability: str) -> bool:
    """Whether the family's models can do `capability` (a key of `CAPABILITIES`).

    Args:
      capability: what is asked of them.

    Returns:
      Whether they can.
    """
    return capability in self.capabilities

  def fit(self, restored: Flat, init: Flat, config: ml_collections.ConfigDict,
          grid_shape: Optional[Sequence[int]] = None, source: str = 'the checkpoint',
          keep_head: bool = False) -> Flat:
    """A checkpoint's flat parameters fitted to a new model: the new head
    (`new_head`), then the family's `fit_rules` in order; what the new model has
    no place for is named in one warning per reason.

    Args:
      restored: the checkpoint's flat parameters, in the published layout.
      init: the new model's freshly initialised flat parameters.
      config: the new model's zoo config.
      grid_shape: the new patch grid, or None to infer a square one.
      source: the checkpoint's path, for messages.
      keep_head: keep the checkpoint's head instead of the new one.

    Returns:
      The fitted flat parameters.

    Raises:
      CheckpointError: a rule refuses the checkpoint.
    """
    fit = Fit(dict(restored), init, config, grid_shape, source, self.head, keep_head)
    for rule in (new_head,) + self.fit_rules:
      rule(fit)
    for why, keys in fit.dropped.items():
      log.warning('Not used from %s, as the new model has %s: %s.', source, why, ', '.join(keys))
    return fit.restored

  @property
  def body(self) -> str:
    """A regex that finds every parameter path outside the classifier head, as
    `lr_mults` take them (the body frozen or at its own learning rate)."""
    return f'^(?!{re.escape(self.head)})'

  def build(self, fields: Mapping[str, Any]) -> nn.Module:
    """The module of a model config's fields (without `family` and `name`).

    Args:
      fields: the config's fields.

    Returns:
      The module.
    """
    kwargs = dict(fields)
    for field in self.sequence_fields:
      if kwargs.get(field) is not None:
        kwargs[field] = _tuples(kwargs[field])
    return self.module(**kwargs)


def _tuples(value):
  """Lists (as configs hold them) as tuples, nested ones too: module fields are hashed."""
  return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
