"""Where the training state lives on the mesh: one `PartitionSpec` per leaf.

`data` (the default) replicates parameters and optimizer state on every device
and splits only the batch. `fsdp` splits every leaf of the state along its
largest axis that the mesh's data axis divides (big_vision's fully sharded rule),
so each device holds about 1/n of it; leaves with no such axis (scalars, a
head's bias of 10 classes on 8 devices) stay replicated. GSPMD inserts the
gathers and reduce-scatters; the batch is split as before. Both compute the
same step up to the order of float sums.
"""
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

RULES = ('data', 'fsdp')
AXIS = 'data'


def leaf_spec(shape, devices: int, rule: str) -> P:
  """The partition of one array of `shape` over `devices` along the data axis."""
  if rule == 'data':
    return P()
  if rule != 'fsdp':
    raise ValueError(f'Unknown sharding {rule!r}; use one of {RULES}.')
  divisible = [axis for axis, size in enumerate(shape) if size % devices == 0 and size > 0]
  if devices == 1 or not divisible:
    return P()
  axis = max(divisible, key=lambda a: (shape[a], -a))  # the largest; the first of equals
  return P(*[AXIS if a == axis else None for a in range(len(shape))])


def state_shardings(state: Any, mesh: Mesh, rule: str) -> Any:
  """A `NamedSharding` for every leaf of `state` (arrays or shape structs)."""
  devices = mesh.shape[AXIS]
  return jax.tree_util.tree_map(
      lambda leaf: NamedSharding(mesh, leaf_spec(getattr(leaf, 'shape', ()), devices, rule)),
      state)


def bytes_per_device(state: Any, device: jax.Device) -> int:
  """Bytes of `state`'s arrays that live on `device`."""
  return sum(shard.data.nbytes for leaf in jax.tree_util.tree_leaves(state)
             for shard in getattr(leaf, 'addressable_shards', []) if shard.device == device)
