"""Command line of the analysis tools: figures (PNG) and their numbers (JSON).

    python -m analysis <tool> --config configs/quickstart_vit.py --workdir workdirs/quickstart_vit \
        [--config2 configs/quickstart_resnet.py --workdir2 workdirs/quickstart_resnet] --out DIR

A model is the recipe that trained it (`--config`: model name, architecture,
image size, dataset) and its parameters (`--workdir` with params.npz, or
`--checkpoint` with any .npz, published or ours). `--steps warmup,last` analyses
a model at several steps of its run (the parameters training kept with
`--config.keep_params_at`), as one model per step. Tools: the registry
(`analysis.tool.TOOLS`: the built-in ones of `analysis/tools/`, and those that
modules named by `--tool_modules` register); `all` runs every one on every
model it applies to, then writes report.html and report.md (every figure with
its caption) and the numbers and figures as TensorBoard events in each model's
workdir (`<workdir>/analysis`). `report` rebuilds the page and the joint
figures from the JSON already in --out.
"""
import importlib
import sys
from typing import Sequence

from vit_jax import cpu_devices

# Split over several CPU devices (XLA_FLAGS), the models' collectives wait for a device
# that other work on the machine holds up, as training's do, before JAX's backend starts.
cpu_devices.patient_collectives()

from analysis import tool  # noqa: E402
from analysis import tools  # noqa: F401,E402  (registers the built-in tools and their flags)
from analysis.cli import command, request  # noqa: E402
from vit_jax import entry  # noqa: E402
from vit_jax.errors import ConfigError  # noqa: E402

TOOL_MODULES_FLAG = '--tool_modules='

request.define_flags()


def import_tool_modules(argv: Sequence[str]) -> None:
  """Imports the modules `--tool_modules=a,b` names, before absl parses the flags.

  Args:
    argv: the command line.
  """
  for arg in argv:
    if arg.startswith(TOOL_MODULES_FLAG):
      for module in filter(None, arg[len(TOOL_MODULES_FLAG):].split(',')):
        importlib.import_module(module)


def main(argv: Sequence[str]) -> None:
  """Runs the tool (or `all`, or `report`) the command line names.

  Args:
    argv: the program and the tool's name.
  """
  if len(argv) != 2 or argv[1] not in list(tool.TOOLS) + ['all', 'report']:
    raise ConfigError(f'Usage: python -m analysis <tool> --config ... ; tools: '
                      f'{", ".join(tool.TOOLS)}, all; or `report --out DIR`.')
  if argv[1] == 'report':
    command.finish(request.FLAGS.out, tensorboard=False)
  else:
    command.run(request.from_flags(argv[1], tuple(sys.argv)))


if __name__ == '__main__':
  import_tool_modules(sys.argv)
  entry.run(main, ('config', 'config2'))
