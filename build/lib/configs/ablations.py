"""The papers' ablations as sweeps over the quick-start recipes on Fashion-MNIST.

    python -m vit_jax.sweep --config configs/ablations.py:window --workdir workdirs/ablations

Args (one sweep each; `vit_jax.sweep` trains every row, resuming finished ones):
  posemb  position embeddings {none, learn, learn2d, sincos2d, relative} x where
          they enter {input, every_layer, every_layer_shared} (the ViT paper's
          Table 8; sincos2d is fixed, so shared and per-layer are one function);
  pool    class token vs global average pooling, each at lr 1e-3, 2e-3, 4e-3
          (the ViT paper found GAP needs its own learning rate);
  skip    the attention or the MLP skip connection of each block removed in
          turn (Raghu et al.);
  window  local attention over k x k patches, k = 3, 5, 8, against global
          (Park & Kim);
  data    the quick-start ViT and ResNet on 6%, 25% and 100% of the training
          split, with the same number of steps (Park & Kim's data scale);
  buildup the quick-start AlterNet's layout built up as Park & Kim build up
          AlterNet: from all convolutions, MSA blocks replace conv blocks one
          at a time from the end of the last stage (alternating), then from the
          end of each earlier stage; trained for the data sweep's steps;
  registers the quick-start ViT without and with 4 registers (Darcet et al.
          2024: learned tokens that take the high-norm outliers off the
          patches), pooling its tokens as the recipe does and reading a class
          token as Darcet et al.'s models do.
Rows train the quick-start ViT for 4 epochs (1,872 steps of 128) so that one
takes at most about 5 minutes on 2 CPU cores; `--config.dataset=cifar10`
(with `--config.image_size=32`) and `--config.num_epochs` run them at scale.
"""
import ml_collections

from configs import quickstart_alternet, quickstart_resnet, quickstart_vit

SWEEPS = ('posemb', 'pool', 'skip', 'window', 'data', 'buildup', 'registers')
EPOCHS = 4
STEPS = 1_872  # 4 epochs of 60,000 images in batches of 128: the data sweep's fixed budget


def _posemb_rows() -> dict:
  rows = {'none': dict(model=dict(posemb='none'))}
  for kind in ('learn', 'learn2d', 'sincos2d', 'relative'):
    wheres = ('input', 'every_layer') if kind == 'sincos2d' else (
        'input', 'every_layer', 'every_layer_shared')
    for where in wheres:
      rows[f'{kind}-{where}'] = dict(model=dict(posemb=kind, posemb_where=where))
  return rows


def _data_rows(vit: ml_collections.ConfigDict, resnet: ml_collections.ConfigDict) -> dict:
  # The ResNet rows take every field in which its recipe differs from the ViT's; with
  # its model name, its model fields replace the ViT's. The steps are the sweep
  # recipe's, so that `--config.total_steps` sets every row's.
  as_resnet = {k: resnet[k] for k in resnet if resnet[k] != vit[k]}
  rows = {}
  for name, fields in (('vit', {}), ('resnet', as_resnet)):
    for percent in (6, 25, 100):
      rows[f'{name}-{percent}%'] = dict(fields, train_split=f'train[:{percent}%]')
  return rows


def _buildup_rows(depths) -> dict:
  """'msa-a-b-c' rows: MSA blocks per stage, added one at a time, last stage first;
  a stage of n blocks takes n // 2 (AlterNet's rule alternates [conv, MSA] at its end)."""
  msa = [0] * len(depths)
  rows = {'msa-' + '-'.join(map(str, msa)): dict(model=dict(num_msa=tuple(msa)))}
  for stage in reversed(range(len(depths))):
    for _ in range(depths[stage] // 2):
      msa[stage] += 1
      rows['msa-' + '-'.join(map(str, msa))] = dict(model=dict(num_msa=tuple(msa)))
  return rows


def sweep(arg: str, vit: ml_collections.ConfigDict, resnet: ml_collections.ConfigDict,
          alternet: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
  """The sweep `arg` over a tier's three recipes.

  Args:
    arg: one of SWEEPS.
    vit: the tier's ViT recipe, which every sweep but `buildup` varies.
    resnet: its ResNet recipe (the `data` sweep's other model).
    alternet: its AlterNet recipe (the `buildup` sweep's).
    steps: the steps of every `data` and `buildup` row.

  Returns:
    The sweep recipe: the varied recipe with `sweep.name` and `sweep.rows`.
  """
  if arg not in SWEEPS:
    raise ValueError(f'Unknown sweep {arg!r}; use one of {SWEEPS}.')
  config = vit
  if arg == 'posemb':
    rows = _posemb_rows()
  elif arg == 'pool':  # each pooling at half, once and twice the recipe's rate
    rows = {f'{pool}-lr{vit.lr * factor:g}': dict(model=dict(classifier=pool),
                                                  lr=vit.lr * factor)
            for pool in ('token', 'gap') for factor in (0.5, 1, 2)}
  elif arg == 'skip':
    rows = {'baseline': {}}
    rows.update({f'block{i}-{branch}': dict(model=dict(skip_removed=((i, branch),)))
                 for i in range(config.model.num_layers) for branch in ('sa', 'mlp')})
  elif arg == 'window':
    rows = {'global': {}}
    rows.update({f'k{k}': dict(model=dict(attention_window=k)) for k in (3, 5, 8)})
  elif arg == 'data':
    rows = _data_rows(vit, resnet)
    config.total_steps = steps
  elif arg == 'registers':
    # The recipe pools its tokens; Darcet et al.'s models read a class token.
    rows = {'none': {}, 'reg4': dict(model=dict(num_registers=4)),
            'token': dict(model=dict(classifier='token')),
            'token-reg4': dict(model=dict(classifier='token', num_registers=4))}
  else:
    config = alternet
    config.total_steps = steps
    rows = _buildup_rows(config.model.num_layers)
  # (label, fields) pairs in table order; a row's fields override the recipe's (see
  # vit_jax.sweep_rows.row_config).
  config.sweep = ml_collections.ConfigDict(dict(name=arg, rows=tuple(rows.items())))
  return config


def get_config(arg: str = 'posemb') -> ml_collections.ConfigDict:
  vit = quickstart_vit.get_config()
  vit.num_epochs = EPOCHS
  return sweep(arg, vit, quickstart_resnet.get_config(), quickstart_alternet.get_config(),
               STEPS)
