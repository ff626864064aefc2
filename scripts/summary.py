"""What a quick start did, in a few lines: each trained workdir's steps (of the
recipe's, and the time budget), evaluation accuracy and wall time, the analysis
time per tool, the report's path, and the CPU it ran on.

    python scripts/summary.py workdirs/quickstart_vit workdirs/quickstart_resnet \
        --analysis workdirs/analysis
"""
import argparse
import json
import os
from typing import List, Optional

from vit_jax import console, cpu_devices


def cpu_name() -> str:
  """The CPU's model name and core count."""
  return f'{cpu_devices.cpu_info()[0]}, {os.cpu_count()} cores'


def _load(path: str) -> Optional[dict]:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


# A run whose machine's load average exceeded this many times its cores was cut short
# by other work.
BUSY = 1.5


def busy_note(ended: dict) -> str:
  """'; the machine was busy ...' for a run whose load cut its steps short, else ''.
  Where the run recorded its share of the cores (`cpu_share`, about 1 on a quiet
  machine), the steps a quiet machine trains in its time are about its steps
  over that share.

  Args:
    ended: the run's results.json.

  Returns:
    The note.
  """
  load, cores = ended.get('load_average'), ended.get('cpu_count')
  if not load or not cores or load <= BUSY * cores:
    return ''
  note = (f'; the machine was busy while it trained (load average {load:.1f} on {cores} '
          'cores)')
  share = ended.get('cpu_share')
  if share:
    quiet = min(round(ended['step'] / min(share, 1.)), ended['total_steps'])
    note += (f': it had {100 * share:.0f}% of the cores, where a quiet machine trains about '
             f'{quiet:,} steps in this time')
  return note


def left_out_note(analysis: str) -> List[str]:
  """The lines on the tools a time budget left out of the analysis in `analysis`."""
  plan = _load(os.path.join(analysis, 'plan.json')) or {}
  left = [n for n, p in plan.items()
          if 'left_out' in p and not os.path.exists(os.path.join(analysis, f'{n}.json'))]
  if not left:
    return []
  return [f'  left out for the time budget: {", ".join(left)} (the report gives the command '
          'that runs each)']


def summary(workdirs: List[str], analysis: Optional[str]) -> str:
  """The summary's lines.

  Args:
    workdirs: the trained workdirs.
    analysis: the analysis directory, or None.

  Returns:
    The text.
  """
  lines = [f'Summary (CPU: {cpu_name()})']
  for workdir in workdirs:
    ended = _load(os.path.join(workdir, 'results.json'))
    if ended is None:
      lines.append(f'  {workdir}: no results.json (the run did not finish)')
      continue
    budget = _load(os.path.join(workdir, 'budget.json'))
    within = f' under a {budget["time_budget"]} budget' if budget else ''
    lines.append(f'  {workdir}: {ended["step"]:,} of {ended["total_steps"]:,} steps{within}, '
                 f'accuracy {100 * ended["eval_accuracy"]:.1f}% on {ended["eval_examples"]:,} '
                 f'images, {console.duration(ended["wall_seconds"])}{busy_note(ended)}')
  if analysis is not None:
    timings = _load(os.path.join(analysis, 'timings.json')) or {}
    report = os.path.abspath(os.path.join(analysis, 'report.html'))
    slowest = ', '.join(f'{name} {console.duration(s)}' for name, s in
                        sorted(timings.items(), key=lambda item: -item[1])[:3])
    total = console.duration(sum(timings.values()))
    lines.append(f'  analysis: {total} ({slowest})' if timings else
                 f'  analysis: no timings.json in {analysis}')
    lines += left_out_note(analysis)
    lines.append(f'  report: {report}' if os.path.exists(report) else
                 f'  report: none in {analysis}')
  return '\n'.join(lines)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('workdirs', nargs='*')
  parser.add_argument('--analysis')
  args = parser.parse_args()
  print(summary(args.workdirs, args.analysis))
