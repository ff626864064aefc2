"""The quick start on a busy machine: `scripts/quickstart.sh` into fresh
directories while `--busy` processes (2 by default) spin beside it, as on a
shared 2-core machine; prints a Markdown table of each phase (wall time, steps
of the recipe's, accuracy, the analysis's time and the samples it planned to fit
its budget) and whether the quick start ended with its summary and report.

    .venv/bin/python benchmarks/quickstart_load.py [--busy 2] [--keep DIR]

Takes about 45 minutes; the numbers are those of one run on this CPU.
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from vit_jax import console, cpu_devices  # noqa: E402


def spin() -> None:
  while True:
    pass


def _load(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def table(work: str, seconds: float, status: int, output: str) -> str:
  rows = ['| phase | wall time | what it did |', '| --- | --- | --- |']
  for model in ('vit', 'resnet'):
    ended = _load(os.path.join(work, f'quickstart_{model}', 'results.json'))
    planned = _load(os.path.join(work, f'quickstart_{model}', 'budget.json'))
    rows.append(
        f'| train {model} | {console.duration(ended["wall_seconds"])} | {ended["step"]:,} of '
        f'{ended["total_steps"]:,} steps (about {planned.get("expected_steps", 0):,} expected at '
        f'the probed speed), accuracy {100 * ended["eval_accuracy"]:.1f}% |' if ended else
        f'| train {model} | | did not finish |')
  analysis = os.path.join(work, 'analysis')
  timings = _load(os.path.join(analysis, 'timings.json'))
  plan = _load(os.path.join(analysis, 'plan.json'))
  failed = _load(os.path.join(analysis, 'failures.json'))
  smaller = '; '.join(f'{tool}: ' + ', '.join(f'{k} {b} instead of {a}' for k, (a, b) in
                                             p['options'].items()) for tool, p in plan.items())
  rows.append(f'| analysis | {console.duration(sum(timings.values()))} | '
              f'{len(timings)} tools, {len(failed)} failed; smaller samples: {smaller or "none"} |')
  ended = 'Summary (CPU:' in output and os.path.exists(os.path.join(analysis, 'report.html'))
  rows.append(f'| quick start | {console.duration(seconds)} | exit status {status}; '
              f'{"ended with its summary and report" if ended else "NO summary or report"} |')
  return '\n'.join(rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--busy', type=int, default=2, help='spinning processes beside it')
  parser.add_argument('--keep', help='run into this directory and keep it (default: a '
                      'temporary one, removed)')
  args = parser.parse_args()
  spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
  for p in spinners:
    p.start()
  with tempfile.TemporaryDirectory() as scratch:
    work = args.keep or scratch
    started = time.perf_counter()
    try:
      run = subprocess.run(['scripts/quickstart.sh'], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, WORKDIRS=os.path.abspath(work)))
    finally:
      for p in spinners:
        p.terminate()
    seconds = time.perf_counter() - started
    print(run.stdout[-3000:])
    print(f'CPU: {cpu_devices.cpu_info()[0]}, {os.cpu_count()} cores; {args.busy} busy '
          'processes beside the quick start.\n')
    print(table(work, seconds, run.returncode, run.stdout))


if __name__ == '__main__':
  main()
