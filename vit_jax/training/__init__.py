"""Training: the loop (`loop`), its train and eval steps, optimizer and schedule
(`steps`), its state and checkpoints (`run_state`), the workdir a run owns (`workdir`),
time budgets (`budget`), the work due after a step (`periodic`), the stall watchdog
(`stall`), signals (`signals`), events (`events`), sharding over the devices
(`sharding`), the recipe's fields (`settings`) and the parameters a run starts from
(`finetune`). It imports the zoo, the files and the data.

The face holds the names the rest of the project uses (`vit_jax.faces`).
"""
from typing import TYPE_CHECKING

from vit_jax import faces

if TYPE_CHECKING:
  from vit_jax.training.budget import parse_duration
  from vit_jax.training.events import EventWriter
  from vit_jax.training.finetune import initial_params, take_folder_model, take_recorded_model
  from vit_jax.training.loop import evaluation_line, train_and_evaluate
  from vit_jax.training.run_state import resume as resume_state, save as save_state
  from vit_jax.training.settings import (add_model_fields, base_config, check as check_settings,
                                         check_overrides, defaults, model_overrides)
  from vit_jax.training.sharding import AXIS, bytes_per_device, make_mesh, state_shardings
  from vit_jax.training.signals import NotedSignals
  from vit_jax.training.steps import (accumulate_gradient, build as build_steps, kernel_mask,
                                      learning_rate_schedule, loss_fn, make_optimizer,
                                      model_config, update as update_step)
  from vit_jax.training.workdir import (claim as claim_workdir, differences as recipe_differences,
                                        kept_params_path, kept_steps, recorded_data,
                                        recorded_settings, settings_of, take_lock)

__getattr__, __dir__ = faces.names(__name__, {
    'budget': ('parse_duration',),
    'events': ('EventWriter',),
    'finetune': ('initial_params', 'take_folder_model', 'take_recorded_model'),
    'loop': ('evaluation_line', 'train_and_evaluate'),
    'run_state': ('resume as resume_state', 'save as save_state'),
    'settings': ('add_model_fields', 'base_config', 'check as check_settings', 'check_overrides',
                 'defaults', 'model_overrides'),
    'sharding': ('AXIS', 'bytes_per_device', 'make_mesh', 'state_shardings'),
    'signals': ('NotedSignals',),
    'steps': ('accumulate_gradient', 'build as build_steps', 'kernel_mask',
              'learning_rate_schedule', 'loss_fn', 'make_optimizer', 'model_config',
              'update as update_step'),
    'workdir': ('claim as claim_workdir', 'differences as recipe_differences', 'kept_params_path',
                'kept_steps', 'recorded_data', 'recorded_settings', 'settings_of', 'take_lock'),
})
