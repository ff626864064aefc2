"""The fault matrix of docs/reliability.md: each case through the command line on
a tiny model and a generated image folder, timed from the command's start
(imports included), with what it printed last.

    .venv/bin/python benchmarks/fault_matrix.py [--cases lr,misspelt,...]

Prints a Markdown table (case, seconds, exit status, message). The disk cases
mount a small tmpfs and need root; they are skipped, saying so, elsewhere.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
from helpers import make_folder  # noqa: E402  (generated image folders, as the tests make them)


def tiny(folder: str, steps: int = 60):
  return [f'--config.dataset={folder}', '--config.image_size=8', '--config.model.hidden_size=16',
          '--config.model.mlp_dim=32', '--config.model.num_layers=1',
          '--config.model.num_heads=2', '--config.batch_size=16', '--config.eval_batch_size=16',
          f'--config.total_steps={steps}', '--config.warmup_steps=2', '--config.eval_every=30',
          '--config.checkpoint_every=30']


def start(module: str, *args) -> subprocess.Popen:
  command = [sys.executable, '-m', module]
  if module == 'vit_jax.train':
    command += ['--config', 'configs/quickstart_vit.py']
  return subprocess.Popen(command + list(args), cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, started: float):
  """(seconds since `started`, exit status, the error line or the last line)."""
  output, _ = process.communicate()
  lines = output.splitlines() or ['']
  said = [line for line in lines if line.startswith('Error:')]
  return time.perf_counter() - started, process.returncode, (said or lines)[-1]


def timed(module: str, *args):
  started = time.perf_counter()
  return finish(start(module, *args), started)


def damage(directory: str) -> None:
  """Every 256th byte of every checkpoint data file inverted."""
  for base, _, names in os.walk(directory):
    for name in names if os.path.basename(base) == 'd' else ():
      path = os.path.join(base, name)
      data = bytearray(open(path, 'rb').read())
      for i in range(0, len(data), 256):
        data[i] ^= 0xFF
      open(path, 'wb').write(bytes(data))


def cases(work: str):
  """name -> a function returning (seconds, exit status, message)."""
  folder = make_folder(os.path.join(work, 'images'), {'train': [40] * 3, 'test': [10] * 3},
                       size=(8, 8))
  train = lambda workdir, *extra: timed('vit_jax.train', '--workdir', workdir, *tiny(folder),
                                        *extra)
  good = os.path.join(work, 'good')

  def trained():
    if not os.path.exists(os.path.join(good, 'params.npz')):
      train(good)
    return good

  def second_trainer():
    busy = os.path.join(work, 'busy')
    first = start('vit_jax.train', '--workdir', busy, *tiny(folder, 100_000))
    while not os.path.exists(os.path.join(busy, 'lock.json')):
      time.sleep(0.1)
    result = train(busy)
    first.send_signal(signal.SIGTERM)
    first.communicate()
    return result

  def sigterm():
    run = os.path.join(work, 'preempted')
    process = start('vit_jax.train', '--workdir', run, *tiny(folder, 100_000),
                    '--config.log_every=1')
    while not any(n.startswith('events') for n in (os.listdir(run) if os.path.isdir(run) else [])):
      time.sleep(0.1)
    time.sleep(3)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    return finish(process, signalled)

  def all_damaged():
    copy = os.path.join(work, 'damaged')
    shutil.copytree(trained(), copy)
    damage(os.path.join(copy, 'checkpoints'))
    os.remove(os.path.join(copy, 'params.npz'))
    return train(copy)

  def folder_case(name, change, *extra):
    root = make_folder(os.path.join(work, name), {'train': [3, 3], 'test': [3, 3]}, size=(8, 8))
    change(os.path.join(work, name))
    return train(os.path.join(work, name + '_run'), f'--config.dataset={root}', *extra)

  def truncate(root):
    path = os.path.join(root, 'train', 'class_0', '0.JPEG')
    data = open(path, 'rb').read()
    open(path, 'wb').write(data[:len(data) // 2])

  def text_npz():
    path = os.path.join(work, 'text.npz')
    open(path, 'w').write('<html>not found</html>')
    return train(os.path.join(work, 'p'), f'--config.pretrained={path}')

  def small_disk():
    small = os.path.join(work, 'small')
    os.makedirs(small, exist_ok=True)
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=300k', 'tmpfs', small],
                      capture_output=True).returncode:
      return 0., None, 'skipped: mounting a small filesystem needs root'
    try:
      return train(os.path.join(small, 'w'))
    finally:
      subprocess.run(['umount', '--lazy', small])

  analysis = lambda *extra: timed('analysis', 'hessian', '--config', 'configs/quickstart_vit.py',
                                  '--checkpoint', os.path.join(work, 'none.npz'), *extra)
  return {
      'lr': lambda: train(os.path.join(work, 'a'), '--config.lr=-0.1'),
      'misspelt': lambda: train(os.path.join(work, 'a'), '--config.learning_rate=0.1'),
      'eval_every': lambda: train(os.path.join(work, 'a'), '--config.eval_every=0'),
      'changed_lr': lambda: train(trained(), '--config.lr=0.01'),
      'changed_model': lambda: train(trained(), '--config.model.num_layers=2'),
      'reconfigure_model': lambda: train(trained(), '--config.model.num_layers=2',
                                         '--reconfigure'),
      'second_trainer': second_trainer,
      'sigterm': sigterm,
      'all_damaged': all_damaged,
      'classes_differ': lambda: folder_case('mismatch', lambda r: os.rename(
          os.path.join(r, 'test', 'class_1'), os.path.join(r, 'test', 'other'))),
      'empty_class': lambda: folder_case('empty', lambda r: os.makedirs(
          os.path.join(r, 'train', 'class_2'))),
      'truncated_jpeg': lambda: folder_case('trunc', truncate),
      'split_outside': lambda: train(os.path.join(work, 'o'), '--config.train_split=../o/train'),
      'text_npz': text_npz,
      'small_disk': small_disk,
      'analysis_num_images': lambda: analysis('--num_images', '0'),
      'analysis_lanczos_steps': lambda: analysis('--lanczos_steps', '0'),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--cases', default='', help='comma-separated case names; all by default')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as work:
    table = cases(work)
    chosen = args.cases.split(',') if args.cases else list(table)
    unknown = sorted(set(chosen) - set(table))
    if unknown:
      parser.error(f'unknown cases {unknown}; the cases are {", ".join(table)}')
    print('| case | seconds | exit status | message |\n| --- | --- | --- | --- |')
    for name in chosen:
      seconds, status, message = table[name]()
      print(f'| {name} | {seconds:.1f} | {status} | {message[:200]} |', flush=True)


if __name__ == '__main__':
  main()
