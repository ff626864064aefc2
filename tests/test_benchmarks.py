"""The benchmarks' own arithmetic: FLOP counts against closed forms; the fault matrix's
cheap cases. (docs/benchmarks.md's commands run at tiny size in tests/test_docs.py.)"""
import importlib.util
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'benchmarks'))

import timing  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
from vit_jax import models  # noqa: E402


def vit_multiply_adds(tokens, patches, patch, width, mlp, layers, classes):
  """Closed form: patch embedding, per block the q/k/v/out and MLP matmuls plus
  the two attention products, and the head."""
  block = tokens * (4 * width * width + 2 * width * mlp) + 2 * tokens * tokens * width
  return patches * patch * patch * 3 * width + layers * block + width * classes


@pytest.mark.parametrize('attention_impl', ['explicit', 'xla'])
def test_vit_b16_forward_flops_match_the_closed_form(attention_impl):
  model = models.get_model('ViT-B_16', 1000, attention_impl=attention_impl)
  images = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  macs = vit_multiply_adds(197, 196, 16, 768, 3072, 12, 1000)
  assert macs == 17_563_828_224  # the 17.6 GMAC per image usually quoted
  assert timing.matmul_flops(model.apply, variables, images) == 2 * macs


def test_conv_flops_count_kernel_window_and_groups():
  x = jax.ShapeDtypeStruct((2, 8, 8, 6), jnp.float32)
  w = jax.ShapeDtypeStruct((3, 3, 3, 4), jnp.float32)  # 2 groups of 3 input channels
  conv = lambda x, w: jax.lax.conv_general_dilated(
      x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'), feature_group_count=2)
  assert timing.matmul_flops(conv, x, w) == 2 * (2 * 8 * 8 * 4) * (3 * 3 * 3)


def test_scanned_matmuls_count_once_per_iteration():
  def f(x):
    return jax.lax.scan(lambda c, _: (c @ c, None), x, None, length=5)[0]
  assert timing.matmul_flops(f, jax.ShapeDtypeStruct((4, 4), jnp.float32)) == 5 * 2 * 4 ** 3


def test_fault_matrix_runs_its_cheap_cases():
  """docs/reliability.md's table comes from benchmarks/fault_matrix.py."""
  result = subprocess.run(
      [sys.executable, os.path.join('benchmarks', 'fault_matrix.py'), '--cases', 'lr,misspelt'],
      capture_output=True, text=True, cwd=REPO, timeout=300)
  assert result.returncode == 0, result.stderr
  rows = [line for line in result.stdout.splitlines() if line.startswith('| ') and
          not line.startswith('| case') and not line.startswith('| ---')]
  assert [row.split(' | ')[0] for row in rows] == ['| lr', '| misspelt']
  assert 'Error: config.lr is -0.1' in rows[0] and 'Did you mean lr?' in rows[1]
  assert all(row.split(' | ')[2] == '1' for row in rows)


@pytest.mark.parametrize('recipe', ['quickstart_vit', 'quickstart_resnet'])
def test_the_timm_peers_of_the_quick_start_models_have_their_shape(recipe):
  """benchmarks/peers_cpu.py compares like with like: timm's model holds as many
  parameters as ours (timm fuses q, k and v into one tensor). Counted in a fresh
  process: torchvision, which timm imports, can crash a process that has run
  TensorFlow's data pipeline (other tests here)."""
  missing = [m for m in ('torch', 'timm') if importlib.util.find_spec(m) is None]
  if missing:
    pytest.skip(f'{" and ".join(missing)} optional, not installed; the CPU peer benchmark '
                'needs them')
  code = f"""
import importlib, jax, jax.numpy as jnp, peers_cpu
from vit_jax import models
config = importlib.import_module('configs.{recipe}').get_config()
ours = models.get_model(config.model_name, 10, **config.model)
variables = jax.eval_shape(ours.init, jax.random.PRNGKey(0),
                           jnp.zeros((1, config.image_size, config.image_size, 3)))
theirs = peers_cpu.{dict(quickstart_vit='quickstart_timm_vit',
                          quickstart_resnet='quickstart_timm_resnet')[recipe]}()
print(sum(x.size for x in jax.tree.leaves(variables)), sum(p.numel() for p in theirs.parameters()))
"""
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=os.path.join(REPO, 'benchmarks'), timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO))
  assert result.returncode == 0, result.stderr
  ours, theirs = result.stdout.split()[-2:]
  assert int(ours) == int(theirs)


def test_the_cpu_peer_benchmark_says_why_it_does_not_run_without_torch():
  code = ("import sys; sys.modules['torch'] = None; sys.argv = ['peers_cpu.py']; "
          "import peers_cpu; peers_cpu.main()")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          cwd=os.path.join(REPO, 'benchmarks'), timeout=300)
  assert result.returncode == 0, result.stderr
  assert 'Skipped: this benchmark needs torch and timm' in result.stdout


def test_the_quick_start_under_load_reads_what_each_phase_wrote(tmp_path):
  """benchmarks/quickstart_load.py's table, from the files the quick start writes."""
  import json
  import quickstart_load
  for model, steps in (('vit', 2812), ('resnet', 2980)):
    (tmp_path / f'quickstart_{model}').mkdir()
    (tmp_path / f'quickstart_{model}' / 'results.json').write_text(json.dumps(
        {'step': steps, 'total_steps': 6084, 'eval_accuracy': 0.877, 'wall_seconds': 897.}))
    (tmp_path / f'quickstart_{model}' / 'budget.json').write_text(json.dumps(
        {'expected_steps': 3000}))
  (tmp_path / 'analysis').mkdir()
  (tmp_path / 'analysis' / 'timings.json').write_text(json.dumps({'cka': 60., 'hessian': 400.}))
  (tmp_path / 'analysis' / 'plan.json').write_text(json.dumps(
      {'hessian': {'time_budget': '15m', 'options': {'hessian_batches': [8, 3]}}}))
  (tmp_path / 'analysis' / 'report.html').write_text('')
  rows = quickstart_load.table(str(tmp_path), 1900., 0, 'Summary (CPU: x)').splitlines()
  assert rows[2] == ('| train vit | 14m57s | 2,812 of 6,084 steps (about 3,000 expected at the '
                     'probed speed), accuracy 87.7% |')
  assert rows[4] == ('| analysis | 7m40s | 2 tools, 0 failed; smaller samples: hessian: '
                     'hessian_batches 3 instead of 8 |')
  assert rows[5] == '| quick start | 31m40s | exit status 0; ended with its summary and report |'


def test_the_operand_types_of_matmuls_and_convolutions_are_read_per_computation():
  """benchmarks/peers_cpu.py reads which dtype XLA computes each matmul and
  convolution in from the program's HLO: here the program as written (a float32
  matmul of converted bfloat16 operands, a bfloat16 convolution) and as
  compiled, whose fused computations each name their operands `param_0`, ...."""
  import peers_cpu
  a = jnp.ones((16, 8), jnp.bfloat16)
  x, w = jnp.ones((2, 8, 8, 4), jnp.bfloat16), jnp.ones((3, 3, 4, 4), jnp.bfloat16)
  f = lambda a, x, w: (a.astype(jnp.float32) @ a.T.astype(jnp.float32),
                       jax.lax.conv_general_dilated(x, w, (1, 1), 'SAME',
                                                    dimension_numbers=('NHWC', 'HWIO', 'NHWC')))
  lowered = jax.jit(f).lower(a, x, w)
  assert peers_cpu.kernel_operand_types(lowered.as_text(dialect='hlo')) == [
      ('f32', 'f32'), ('bf16', 'bf16')]
  assert len(peers_cpu.kernel_operand_types(lowered.compile().as_text())) == 2


# What docs/benchmarks.md ("bfloat16 on a CPU") states of each JAX measured: whether
# XLA:CPU computes any matmul or convolution of a bfloat16 model in bfloat16.
BFLOAT16_KERNELS_ON_CPU = {'0.10.2': False, '0.12.0.1': True}


@pytest.mark.parametrize('family', ['vit', 'bit'])
def test_xla_cpu_computes_a_bfloat16_models_kernels_as_the_docs_say(family):
  """docs/benchmarks.md ("bfloat16 on a CPU"), docs/training.md and docs/models.md
  tell CPU users that with JAX 0.10.2 XLA:CPU converts bfloat16 operands to
  float32 for every matmul and convolution (bfloat16 saves no time), and that
  JAX 0.12.0.1 keeps most of them in bfloat16. Another JAX is reported, to be
  measured (benchmarks/peers_cpu.py) and documented."""
  import peers_cpu
  from helpers import tiny_family_config
  if jax.default_backend() != 'cpu':
    pytest.skip('a fact of XLA:CPU')
  if jax.__version__ not in BFLOAT16_KERNELS_ON_CPU:
    pytest.skip(f'bfloat16 on XLA:CPU is documented for JAX {", ".join(BFLOAT16_KERNELS_ON_CPU)}, '
                f'not {jax.__version__}: measure it with benchmarks/peers_cpu.py --only '
                'vit_b16_infer_8_bf16,bit_r50x1_infer_8_bf16 and document it')
  model = models.build_model(tiny_family_config(family, dtype='bfloat16'))
  images = jnp.zeros((2, 32, 32, 3), jnp.float32)
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  lowered = jax.jit(model.apply).lower(variables, images)
  as_written = peers_cpu.kernel_operand_types(lowered.as_text(dialect='hlo'))
  assert as_written and all(types == ('bf16', 'bf16') for types in as_written), as_written
  compiled = peers_cpu.kernel_operand_types(lowered.compile().as_text())
  assert compiled, lowered.compile().as_text()
  in_bfloat16 = any(types == ('bf16', 'bf16') for types in compiled)
  assert in_bfloat16 == BFLOAT16_KERNELS_ON_CPU[jax.__version__], compiled
  if not in_bfloat16:
    assert all(types == ('f32', 'f32') for types in compiled), compiled


def test_the_peer_table_compares_ours_with_timm_and_bfloat16_with_float32():
  import peers_cpu
  lines = peers_cpu.table_lines('w', {'ours tuned': 30., 'ours notebook': 10.,
                                      'timm eager': 12.5, 'timm compiled': 20.})
  assert [line.split()[-2:] for line in lines[:2]] == [['2.40x', '1.50x'], ['0.80x', '0.50x']]
  lines = peers_cpu.table_lines('w', {'ours notebook': 9., 'ours notebook f32': 10.,
                                      'timm eager': 20., 'timm eager f32': 10.})
  assert [line.split()[-2:] for line in lines] == [
      ['0.45x', '0.90x'], ['10.00', '1.00x'], ['20.00', '2.00x'], ['f32', '10.00']]
