"""The fault matrix of docs/reliability.md: each case through the command line on
a tiny model and a generated image folder, timed from the command's start
(imports included), with what it printed last.

    .venv/bin/python benchmarks/fault_matrix.py [--cases lr,misspelt,...]

Prints a Markdown table (case, seconds, exit status, message); `--record
docs/measured/NAME.json` also writes it as a record the docs quote
(scripts/docs_figures.py). The disk cases mount a small tmpfs and need root;
they are skipped, saying so, elsewhere.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tests'))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))
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
  said = [i for i, line in enumerate(lines) if line.startswith('Error:')]
  message = ' '.join(lines[said[-1]:]) if said else lines[-1]  # an error may span lines
  return time.perf_counter() - started, process.returncode, message


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

  def overlapping():
    """A .safetensors whose two arrays share their bytes, as the library refuses it."""
    header = json.dumps({'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]},
                         'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}).encode()
    path = os.path.join(work, 'overlap.safetensors')
    with open(path, 'wb') as f:
      f.write(len(header).to_bytes(8, 'little') + header + bytes(16))
    return path

  def second_trainer():
    busy = os.path.join(work, 'busy')
    first = start('vit_jax.train', '--workdir', busy, *tiny(folder, 100_000))
    while not os.path.exists(os.path.join(busy, 'lock.json')):
      time.sleep(0.1)
    result = train(busy)
    first.send_signal(signal.SIGTERM)
    first.communicate()
    return result

  def signalled(name, signum):
    """A long run sent `signum` 3 s after its first log: seconds from the signal."""
    run = os.path.join(work, name)
    process = start('vit_jax.train', '--workdir', run, *tiny(folder, 100_000),
                    '--config.log_every=1')
    while not any(n.startswith('events') for n in (os.listdir(run) if os.path.isdir(run) else [])):
      time.sleep(0.1)
    time.sleep(3)
    sent = time.perf_counter()
    process.send_signal(signum)
    return finish(process, sent)

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

  def on_trained(*extra):
    """The analysis of the trained tiny model, its recipe's fields given, on 60 images."""
    return timed('analysis', 'calibration', '--config', 'configs/quickstart_vit.py',
                 '--workdir', trained(), *tiny(folder)[:6], '--num_images', '60',
                 '--batch_size', '30', *extra)

  def recipe(text):
    path = os.path.join(work, f'recipe_{abs(hash(text))}.py')
    open(path, 'w').write(text)
    return timed('vit_jax.train', '--workdir', os.path.join(work, 'r'), '--config', path)

  def sweep(rows):
    path = os.path.join(work, f'sweep_{abs(hash(rows))}.py')
    open(path, 'w').write(
        'from configs import quickstart_vit\n\ndef get_config():\n'
        '  config = quickstart_vit.get_config()\n'
        f'  config.sweep = dict(name="s", rows={rows})\n  return config\n')
    return timed('vit_jax.sweep', '--config', path, '--workdir', os.path.join(work, 'sweep'),
                 *tiny(folder))

  def reconfigure_finished():
    copy = os.path.join(work, 'finished')
    shutil.copytree(trained(), copy)
    return train(copy, '--config.lr=0.01', '--reconfigure')

  def record_deleted():
    copy = os.path.join(work, 'unrecorded')
    shutil.copytree(trained(), copy)
    os.remove(os.path.join(copy, 'config.json'))
    return train(copy)

  def inf_npz():
    import numpy as np
    params = dict(np.load(os.path.join(trained(), 'params.npz')))
    kernel = next(k for k in params if k.endswith('kernel'))
    params[kernel] = params[kernel].copy()
    params[kernel].flat[0] = np.inf
    path = os.path.join(work, 'inf.npz')
    np.savez(path, **params)
    return train(os.path.join(work, 'i'), f'--config.pretrained={path}')

  def workdir_file():
    path = os.path.join(work, 'a_file')
    open(path, 'w').close()
    return train(path)

  def damage_png(root):
    path = os.path.join(root, 'train', 'class_0', '1.png')
    data = bytearray(open(path, 'rb').read())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(255 - b for b in data[middle:middle + 8])
    open(path, 'wb').write(bytes(data))

  def latin1_class(root):
    os.rename(os.path.join(root, 'train', 'class_1'),
              os.fsencode(os.path.join(root, 'train')) + b'/caf\xe9')

  def duplicate_classnames():
    path = os.path.join(work, 'classnames.txt')
    open(path, 'w').write('cat\nCat\ndog\n')
    return timed('vit_jax.zeroshot', '--model', 'LiT-B16B', '--checkpoint',
                 os.path.join(work, 'x.npz'), '--dataset', folder, '--classnames', path)

  def out_file():
    path = os.path.join(work, 'out_file')
    open(path, 'w').close()
    return on_trained('--out', path)

  def data_changed():
    """A run's folder gains a class in both splits after it trained; the same
    command again."""
    import shutil
    root = os.path.join(work, 'images_more')
    shutil.copytree(folder[len('folder:'):], root)
    run = os.path.join(work, 'data_run')
    timed('vit_jax.train', '--workdir', run, *tiny(f'folder:{root}'))
    for split in ('train', 'test'):
      shutil.copytree(os.path.join(root, split, 'class_0'), os.path.join(root, split, 'class_9'))
    return timed('vit_jax.train', '--workdir', run, *tiny(f'folder:{root}'))

  def other_classes():
    """The trained model analysed on a folder of as many classes under other names."""
    import shutil
    root = os.path.join(work, 'renamed')
    shutil.copytree(folder[len('folder:'):], root)
    for split in ('train', 'test'):
      for i, name in enumerate(('cat', 'dog', 'eel')):
        os.rename(os.path.join(root, split, f'class_{i}'), os.path.join(root, split, name))
    return on_trained('--dataset', f'folder:{root}', '--num_images', '30')

  def broken_link(root):
    os.symlink(os.path.join(root, 'gone.jpg'), os.path.join(root, 'train', 'class_0', 'link.jpg'))

  def hostile(name):
    """A torch.save-style zip whose pickle deletes `victim.txt` when unpickled
    (protocol 4: `pathlib.Path.unlink` as one dotted name), and the victim."""
    import pathlib
    import pickle
    import zipfile

    class Deletes:
      def __reduce__(self):
        return pathlib.Path.unlink, (pathlib.Path(victim),)
    victim = os.path.join(work, f'{name}_victim.txt')
    open(victim, 'w').write('kept')
    path = os.path.join(work, name)
    with zipfile.ZipFile(path, 'w') as z:
      z.writestr('archive/data.pkl', pickle.dumps({'state_dict': Deletes()}, protocol=4))
    return path, victim

  def kept(result, victim):
    seconds, status, message = result
    return seconds, status, message + ('' if os.path.exists(victim) else ' (THE FILE WAS DELETED)')

  def hostile_pretrained():
    path, victim = hostile('evil.pth')
    return kept(train(os.path.join(work, 'h'), f'--config.pretrained={path}'), victim)

  def hostile_sae():
    path, victim = hostile('evil_sae.pt')
    return kept(timed('analysis', 'sae', '--config', 'configs/quickstart_vit.py', '--workdir',
                      trained(), *tiny(folder)[:6], '--num_images', '60', '--batch_size', '30',
                      '--sae_load', path), victim)
  return {
      'lr': lambda: train(os.path.join(work, 'a'), '--config.lr=-0.1'),
      'misspelt': lambda: train(os.path.join(work, 'a'), '--config.learning_rate=0.1'),
      'eval_every': lambda: train(os.path.join(work, 'a'), '--config.eval_every=0'),
      'changed_lr': lambda: train(trained(), '--config.lr=0.01'),
      'changed_model': lambda: train(trained(), '--config.model.num_layers=2'),
      'reconfigure_model': lambda: train(trained(), '--config.model.num_layers=2',
                                         '--reconfigure'),
      'second_trainer': second_trainer,
      'sigterm': lambda: signalled('preempted', signal.SIGTERM),
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
      'not_an_integer': lambda: train(os.path.join(work, 'a'), '--config.batch_size=abc'),
      'lr_inf': lambda: train(os.path.join(work, 'a'), '--config.lr=inf'),
      'epochs_inf': lambda: train(os.path.join(work, 'a'), '--config.num_epochs=inf'),
      'heads_width': lambda: train(os.path.join(work, 'a'), '--config.model.num_heads=3'),
      'patch_image': lambda: train(os.path.join(work, 'a'), '--config.image_size=2'),
      'image_patch': lambda: train(os.path.join(work, 'a'), '--config.image_size=10'),
      'recipe_syntax': lambda: recipe('def get_config(:\n'),
      'recipe_no_get_config': lambda: recipe('x = 1\n'),
      'lr_mults_regex': lambda: train(os.path.join(work, 'a'), "--config.lr_mults=(('[a', 0.),)"),
      'lr_mults_nothing': lambda: train(os.path.join(work, 'a'),
                                        "--config.lr_mults=(('Transformr/', 0.),)"),
      'keep_params_beyond': lambda: train(os.path.join(work, 'k'), '--config.keep_params_at=500'),
      'reconfigure_finished': reconfigure_finished,
      'record_deleted': record_deleted,
      'ctrl_c': lambda: signalled('interrupted', signal.SIGINT),
      'workdir_file': workdir_file,
      'inf_npz': inf_npz,
      'one_class': lambda: train(os.path.join(work, 'c'), '--config.dataset=' + make_folder(
          os.path.join(work, 'one'), {'train': [4], 'test': [4]}, size=(8, 8))),
      'empty_test_image': lambda: folder_case('zero', lambda r: open(
          os.path.join(r, 'test', 'class_0', 'zero.jpg'), 'w').close()),
      'dataset_is_a_path': lambda: train(os.path.join(work, 'd'),
                                         f'--config.dataset={folder[len("folder:"):]}'),
      'empty_split': lambda: train(os.path.join(work, 'e'), '--config.dataset=fashion_mnist',
                                   '--config.train_split=train[:0]'),
      'sweep_duplicate': lambda: sweep("(('c', {}), ('c', dict(lr=2e-2)))"),
      'sweep_bad_field': lambda: sweep("(('c', {}), ('d', dict(lr_typo=1.)))"),
      'analysis_no_params': lambda: timed(
          'analysis', 'calibration', '--config', 'configs/quickstart_vit.py', '--workdir',
          os.path.join(work, 'images')),
      'analysis_num_images_beyond': lambda: on_trained('--num_images', '100000'),
      'analysis_out_file': out_file,
      'analysis_out_run': lambda: on_trained('--out', trained(), '--overwrite'),
      'damaged_png': lambda: folder_case('damaged', damage_png),
      'class_not_utf8': lambda: folder_case('latin1', latin1_class),
      'registers_true': lambda: recipe(
          'from configs import quickstart_vit\n\ndef get_config():\n'
          '  config = quickstart_vit.get_config()\n  config.model.num_registers = True\n'
          '  return config\n'),
      'recipe_dict': lambda: recipe('def get_config():\n  return {"lr": 0.1}\n'),
      'recipe_raises': lambda: recipe('def get_config():\n  raise KeyError("lr")\n'),
      'recipe_missing_module': lambda: recipe('import no_such_module\n'),
      'recipe_needs_argument': lambda: recipe('def get_config(arg):\n  pass\n'),
      'time_budget_bare': lambda: train(os.path.join(work, 'a'), '--config.time_budget=90'),
      'reconfigure_registers': lambda: train(trained(), '--config.model.num_registers=2',
                                             '--reconfigure'),
      'analysis_budget_zero': lambda: on_trained('--time_budget=0s'),
      'analysis_second_without_recipe': lambda: on_trained('--workdir2', trained()),
      'analysis_head_cka_one_model': lambda: timed(
          'analysis', 'head_cka', '--config', 'configs/quickstart_vit.py', '--workdir',
          trained(), *tiny(folder)[:6], '--num_images', '60', '--batch_size', '30'),
      'zeroshot_duplicate_classes': duplicate_classnames,
      'hostile_pth_pretrained': hostile_pretrained,
      'data_changed': data_changed,
      'analysis_other_classes': other_classes,
      'broken_link': lambda: folder_case('linked', broken_link),
      'hostile_sae_file': hostile_sae,
      'seed_negative': lambda: train(os.path.join(work, 'seed'), '--config.seed=-1'),
      'dtype_float8': lambda: train(os.path.join(work, 'f8'), '--config.model.dtype=float8'),
      'export_into_its_workdir': lambda: timed('vit_jax.export', '--workdir', trained(), '--out',
                                               trained()),
      'export_over_other_files': lambda: timed('vit_jax.export', '--workdir', trained(), '--out',
                                               folder[len('folder:'):]),
      'pretrained_overlapping_safetensors': lambda: train(
          os.path.join(work, 'overlap'), f'--config.pretrained={overlapping()}',
          '--config.model_name=ViT-Ti_16'),
      'zeroshot_batch_size': lambda: timed(
          'vit_jax.zeroshot', '--model', 'LiT-B16B', '--checkpoint', os.path.join(work, 'x.npz'),
          '--dataset', folder, '--batch_size', '0'),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--cases', default='', help='comma-separated case names; all by default')
  parser.add_argument('--record', default=None, metavar='PATH',
                      help='also write the rows, the date and the CPU to PATH (JSON)')
  args = parser.parse_args()
  from docs_figures import check_record_path, write_record  # scripts/, on the path above
  if args.record:
    try:
      check_record_path(args.record, 'fault_matrix')
    except ValueError as error:
      parser.error(str(error))
  rows, load = [], os.getloadavg()[0]
  with tempfile.TemporaryDirectory() as work:
    table = cases(work)
    chosen = args.cases.split(',') if args.cases else list(table)
    unknown = sorted(set(chosen) - set(table))
    if unknown:
      parser.error(f'unknown cases {unknown}; the cases are {", ".join(table)}')
    print('| case | seconds | exit status | message |\n| --- | --- | --- | --- |')
    for name in chosen:
      seconds, status, message = table[name]()
      rows.append({'case': name, 'seconds': round(seconds, 1), 'status': status,
                   'message': message[:200]})
      print(f'| {name} | {seconds:.1f} | {status} | {message[:200]} |', flush=True)
  if args.record:
    import datetime
    from vit_jax import cpu_devices
    write_record(args.record, {
        'kind': 'fault_matrix', 'date': datetime.date.today().isoformat(),
        'command': 'benchmarks/fault_matrix.py' + (f' --cases {args.cases}'
                                                   if args.cases else ''),
        'cpu': f'{cpu_devices.cpu_info()[0]} ({os.cpu_count()} cores)',
        'load': round(load, 2), 'rows': rows})


if __name__ == '__main__':
  main()
