"""Parameter trees in the published layout: nested dicts and their flat
'/'-joined form, other layouts read under the published names (by the family
that owns the tree), and the checks a tree of parameters must pass (shapes against a
model, finite values)."""
from typing import Any, Dict, List, Mapping

import flax
import jax
import numpy as np

from vit_jax import models
from vit_jax.models.family import CheckpointError, Flat

Params = Dict[str, Any]


def published(flat: Flat) -> Flat:
  """A flat tree in the published layout, whatever layout it came in.

  Args:
    flat: {'a/b/kernel': array} in the published layout or a family's other
      one (current-Flax block names, big_vision).

  Returns:
    The same arrays under the published names: the family that owns the tree
    (`Family.owns`) reads it (`Family.to_published`); a tree no family owns is
    in the published layout already.

  Raises:
    CheckpointError: two families own the tree (their `owns` overlap).
  """
  owners = [f for f in models.FAMILIES.values() if f.owns(flat)]
  if len(owners) > 1:
    raise CheckpointError(f'The families {", ".join(f.name for f in owners)} each own this '
                          'tree; their Family.owns must tell their layouts apart.')
  return dict(owners[0].to_published(flat)) if owners else dict(flat)


def flatten(params: Mapping[str, Any]) -> Dict[str, Any]:
  """A nested parameter tree as one flat dict.

  Args:
    params: the nested tree, or `{'params': tree}` as `Module.init` gives it.

  Returns:
    {'a/b/kernel': array}, the form the `.npz` files hold.
  """
  params = flax.core.unfreeze(params)
  if set(params) == {'params'}:
    params = params['params']
  return flax.traverse_util.flatten_dict(params, sep='/')


def unflatten(flat: Mapping[str, Any]) -> Params:
  """The nested tree of a flat dict (`flatten`'s inverse).

  Args:
    flat: {'a/b/kernel': array}.

  Returns:
    {'a': {'b': {'kernel': array}}}.
  """
  return flax.traverse_util.unflatten_dict(dict(flat), sep='/')


def published_float32(params: Mapping[str, Any]) -> Flat:
  """A parameter tree, flat in the published layout, as float32 numpy arrays: what
  the exports to timm and `transformers` convert.

  Args:
    params: the tree (any layout `published` reads).

  Returns:
    name -> float32 array.
  """
  return {k: np.asarray(v, np.float32) for k, v in published(flatten(params)).items()}


def non_finite(tree: Any) -> List[str]:
  """The arrays of a tree that hold NaN or infinity.

  Args:
    tree: any tree of arrays (a flat dict, parameters, a train state).

  Returns:
    The key paths (`jax.tree_util.keystr`) of its floating arrays with a
    non-finite element; empty when all are finite.
  """
  return [jax.tree_util.keystr(path)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
          if np.issubdtype(np.asarray(leaf).dtype, np.floating) and not np.all(np.isfinite(leaf))]


def check_matches(flat: Mapping[str, Any], reference: Mapping[str, Any], source: str) -> None:
  """Checks that a flat tree has the keys and shapes of a model's.

  Args:
    flat: the flat tree read from a file.
    reference: the model's flat tree (arrays or shape structs).
    source: what `flat` came from, for the message (a path).

  Raises:
    CheckpointError: naming every missing, unexpected and misshaped key.
  """
  missing = sorted(set(reference) - set(flat))
  unexpected = sorted(set(flat) - set(reference))
  misshaped = sorted(f'{k}: checkpoint {tuple(np.shape(flat[k]))}, model '
                     f'{tuple(np.shape(reference[k]))}'
                     for k in set(flat) & set(reference)
                     if np.shape(flat[k]) != np.shape(reference[k]))
  if missing or unexpected or misshaped:
    lines = [f'{source} does not fit the model:']
    for title, keys in (('missing', missing), ('unexpected', unexpected),
                        ('wrongly shaped', misshaped)):
      if keys:
        lines.append(f'  {len(keys)} {title}: ' + ', '.join(keys[:20]) +
                     (', ...' if len(keys) > 20 else ''))
    lines.append('Check that the model name and its overrides match the checkpoint.')
    raise CheckpointError('\n'.join(lines))
