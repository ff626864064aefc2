"""A new family is its module plus one registry line: registered from outside the
package (here a pytest plugin), it is tested by every test parametrised over the
families, without editing the suite."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import TINY_MIXER
from vit_jax import models
from vit_jax.models import mixer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = textwrap.dedent('''\
    import dataclasses
    from vit_jax import models
    from vit_jax.models import mixer

    models.register(dataclasses.replace(
        mixer.FAMILY, name='throwaway', title='Throwaway',
        variants={'Throwaway-T_8': dict(mixer.FAMILY.variants['Mixer-S_16'], patch_size=8)},
        tiny=('Throwaway-T_8', dict(mixer.FAMILY.tiny[1]))))
''')
# The modules holding tests parametrised over the families (`family_name`).
FAMILY_SUITE = ('test_lesion.py', 'test_representation_tools.py', 'test_registry.py',
                'test_checkpoint.py', 'test_train.py')


def test_registering_refuses_a_name_taken():
  import dataclasses
  with pytest.raises(ValueError, match="'mixer' or its variants"):
    models.register(mixer.FAMILY)
  with pytest.raises(ValueError, match='not one of its variants'):
    models.register(dataclasses.replace(mixer.FAMILY, name='other', variants={'Other-1': {}},
                                        tiny=('Mixer-B_16', TINY_MIXER)))
  assert 'other' not in models.FAMILIES


@pytest.mark.parametrize('changes,says', [
    (dict(capabilities=frozenset({'fly'})), r"capabilities \['fly'\]; the known ones are"),
    (dict(layers=None), 'classifies, so it declares its sown `layers` and its `head`'),
    (dict(capabilities=frozenset({models.CLASSIFY, models.TENSOR_PARALLEL})),
     "declares 'tensor-parallel' exactly when it gives the `tensor_parallel` rules"),
])
def test_registering_refuses_capabilities_the_record_cannot_back(changes, says):
  import dataclasses
  family = dataclasses.replace(mixer.FAMILY, name='other', variants={'Other-1': {}},
                               tiny=('Other-1', {}), **changes)
  with pytest.raises(ValueError, match=says):
    models.register(family)
  assert 'other' not in models.FAMILIES


@pytest.mark.slow
def test_a_family_registered_outside_is_tested_by_the_suite(tmp_path):
  (tmp_path / 'throwaway_family.py').write_text(PLUGIN)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(ROOT, 'tests'),
                                                     os.environ.get('PYTHONPATH', '')]))
  done = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'throwaway_family', '-k', 'throwaway',
       '-m', 'not slow', '-p', 'no:cacheprovider',
       *[os.path.join('tests', m) for m in FAMILY_SUITE]],
      capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  passed = int(re.search(r'(\d+) passed', done.stdout).group(1))
  # Every module of the suite has tests that take the family: at least one each.
  assert passed >= len(FAMILY_SUITE), done.stdout[-2000:]
  assert 'failed' not in done.stdout and 'error' not in done.stdout.lower()


def test_no_test_module_imports_another():
  """Shared fixtures are in conftest.py and shared makers in helpers.py: a test
  module importing another would run that module's tests' set-up, and hide what
  the suite shares."""
  import ast
  import glob
  found = []
  for path in glob.glob(os.path.join(ROOT, 'tests', 'test_*.py')):
    for node in ast.walk(ast.parse(open(path).read())):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
      found += [f'{os.path.basename(path)}:{node.lineno} imports {n}' for n in names
                if n.split('.')[0].startswith('test_')]
  assert found == []
