"""Where the training state lives on the mesh: one `PartitionSpec` per leaf.

The mesh has a `data` axis and a `model` axis (`make_mesh`; the model axis is
1 device long unless `model_parallel` says otherwise). Batches are split over
`data`.

`data` (the default rule) replicates parameters and optimizer state on every
device of the data axis; `fsdp` splits every leaf of the state along its
largest axis that the data axis divides (big_vision's fully sharded rule), so
each device holds about 1/n of it; leaves with no such axis (scalars, a head's
bias of 10 classes on 8 devices) stay replicated.

With a model axis longer than 1, attention and MLP kernels are also split over
it, Megatron-style (tensor parallelism): the query, key and value kernels and
biases by head, the output projection by head, the MLP's first kernel and bias
by hidden unit and its second kernel by hidden unit (each family's `Family.tensor_parallel`); each
device then computes its heads and hidden units, and GSPMD inserts the
reductions after the output projection and the second MLP kernel. Stacked
(scanned) blocks keep their layer axis first, so the rules count axes from the
end. Every rule computes the same step up to the order of float sums.
"""
import re
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import models
from vit_jax.errors import ConfigError

RULES = ('data', 'fsdp')
AXIS = 'data'
MODEL_AXIS = 'model'


def make_mesh(devices: Optional[Sequence[jax.Device]] = None, model_parallel: int = 1) -> Mesh:
  """A (data, model) mesh of `devices` (all by default), `model_parallel` long on the
  model axis.

  Args:
    devices: the devices (all of them if None).
    model_parallel: the model axis' length.

  Returns:
    The mesh.
  """
  devices = np.array(devices if devices is not None else jax.devices())
  if model_parallel < 1 or devices.size % model_parallel:
    raise ConfigError(f'config.model_parallel={model_parallel} does not divide the '
                      f'{devices.size} devices; use a divisor of {devices.size}.')
  return Mesh(devices.reshape(-1, model_parallel), (AXIS, MODEL_AXIS))


def tensor_parallel_axis(path: str, ndim: int) -> Optional[int]:
  """The axis of the parameter (or its optimizer state) at `path` that the model
  axis splits, or None.

  Args:
    path: the '/'-joined path.
    ndim: the array's number of axes.

  Returns:
    The axis, or None.
  """
  for family in models.FAMILIES.values():
    for pattern, axis in family.tensor_parallel:
      if re.search(pattern, path) and ndim >= -axis:
        return ndim + axis
  return None


def leaf_spec(shape: Sequence[int], devices: int, rule: str, path: str = '', model: int = 1) -> P:
  """The partition of one array of `shape` at parameter `path` over `devices` along
  the data axis and `model` devices along the model axis.

  Args:
    shape: the array's shape.
    devices: the data axis' length.
    rule: 'data' or 'fsdp' (`config.sharding`).
    path: the parameter's path.
    model: the model axis' length.

  Returns:
    The partition spec.
  """
  if rule not in RULES:
    raise ValueError(f'Unknown sharding {rule!r}; use one of {RULES}.')
  spec = [None] * len(shape)
  split = tensor_parallel_axis(path, len(shape)) if model > 1 else None
  if split is not None:
    if shape[split] % model:
      raise ConfigError(f'{path} has {shape[split]} entries on the axis that model '
                        f'parallelism splits, which config.model_parallel={model} does not '
                        'divide; use a divisor of the heads and the MLP width.')
    spec[split] = MODEL_AXIS
  if rule == 'fsdp' and devices > 1:
    divisible = [axis for axis, size in enumerate(shape)
                 if size % devices == 0 and size > 0 and axis != split]
    if divisible:
      axis = max(divisible, key=lambda a: (shape[a], -a))  # the largest; the first of equals
      spec[axis] = AXIS
  return P(*spec) if any(spec) else P()


def path_string(key_path: Any) -> str:
  """'/'-joined dict keys and attribute names of a key path (optimizer states mirror
  the parameter paths under their own fields).

  Args:
    key_path: a JAX key path.

  Returns:
    The path.
  """
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k))))
                  for k in key_path)


def state_shardings(state: Any, mesh: Mesh, rule: str) -> Any:
  """A `NamedSharding` for every leaf of `state` (arrays or shape structs).

  Args:
    state: the training state.
    mesh: the device mesh.
    rule: 'data' or 'fsdp'.

  Returns:
    A tree of shardings like `state`.
  """
  devices = mesh.shape[AXIS]
  model = mesh.shape.get(MODEL_AXIS, 1)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: NamedSharding(mesh, leaf_spec(getattr(leaf, 'shape', ()), devices, rule,
                                                       path_string(path), model)),
      state)


def bytes_per_device(state: Any, device: jax.Device) -> int:
  """Bytes of `state`'s arrays that live on `device`.

  Args:
    state: a tree of arrays.
    device: the device.

  Returns:
    The bytes.
  """
  return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state)
             for shard in getattr(leaf, 'addressable_shards', []) if shard.device == device)
