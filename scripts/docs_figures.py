"""The figures the docs quote from a measurement, written from its record.

A measuring command writes a record, a JSON file under `docs/measured/` (the test
suite: `scripts/test.sh ... --record-suite=docs/measured/<name>.json`; the fault
matrix: `benchmarks/fault_matrix.py --record docs/measured/<name>.json`). A page
quotes it in a region

    <!-- measured: suite_default.json -->
    ...
    <!-- /measured -->

whose text this script writes from the record; the docs tests fail where a
region's text is not what its record gives, so no figure there is typed.

    python scripts/docs_figures.py          # rewrites every page's regions
    python scripts/docs_figures.py --check  # names the regions out of date
"""
import argparse
import json
import os
import re
import sys
from typing import Dict, List

from vit_jax.errors import WorkdirError
from vit_jax.files import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED = os.path.join(ROOT, 'docs', 'measured')
REGION = re.compile(r'(<!-- measured: (?P<name>[\w.-]+) -->\n)(?P<text>.*?)(<!-- /measured -->)',
                    re.S)


def _minutes(seconds: float) -> str:
  return f'{int(seconds // 60)}m{int(round(seconds % 60)):02d}s'


def _load(record: Dict) -> str:
  """The machine's load average (one minute) as the measurement began."""
  return f', load average {record["load"]:.1f} at the start' if 'load' in record else ''


def suite_text(record: Dict) -> str:
  """The sentence of a test session's record (tests/conftest.py, `--record-suite`).

  Args:
    record: the record's fields.

  Returns:
    Its Markdown, ending in a newline.
  """
  counts = ', '.join(f'{record[kind]:,} {kind}' for kind in ('passed', 'skipped', 'failed',
                                                                'errors') if record[kind])
  return (f'On {record["date"]}, `{record["command"]}` ({record["selection"]}, '
          f'{record["workers"]}) gave {counts} in {_minutes(record["seconds"])} of pytest '
          f'on {record["cpu"]}{_load(record)}, Python {record["python"]}, JAX '
          f'{record["jax"]}.\n')


def fault_matrix_text(record: Dict) -> str:
  """The table of a fault-matrix record (benchmarks/fault_matrix.py, `--record`).

  Args:
    record: the record's fields.

  Returns:
    Its Markdown: a sentence saying when, where and how, then the table.
  """
  cell = lambda text: str(text).replace('|', '\\|')
  lines = [f'On {record["date"]}, on {record["cpu"]}{_load(record)}, '
           f'`{record["command"]}` printed:', '', '| case | seconds | exit status | message |',
           '| --- | --- | --- | --- |']
  lines += [f'| {r["case"]} | {r["seconds"]:.1f} | {r["status"]} | {cell(r["message"])} |'
            for r in record['rows']]
  return '\n'.join(lines) + '\n'


RENDER = {'suite': suite_text, 'fault_matrix': fault_matrix_text}


def region_text(name: str) -> str:
  """The text of a region quoting the record `docs/measured/<name>`."""
  path = os.path.join(MEASURED, name)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path}: no such record; measure it first '
                            '(scripts/docs_figures.py says how).')
  with open(path) as f:
    record = json.load(f)
  if record.get('kind') not in RENDER:
    raise ValueError(f'{path}: a record of kind {record.get("kind")!r}; this script writes '
                     f'those of kinds {", ".join(RENDER)}.')
  return RENDER[record['kind']](record)


def check_record_path(path: str, kind: str) -> None:
  """Refuses a record's path that holds anything but a record of `kind`: a
  measurement replaces only what one wrote, and says so before it measures.

  Args:
    path: the record's file.
    kind: the record's kind.

  Raises:
    ValueError: `path` holds something else.
  """
  if os.path.exists(path):
    try:
      with open(path) as f:
        found = json.load(f).get('kind')
    except (OSError, ValueError, AttributeError):
      found = None
    if found != kind:
      raise ValueError(f'{path} holds something other than a {kind} record: give a new path, '
                       'or one of a record written before.')


def write_record(path: str, record: Dict) -> None:
  """Writes a measurement's record to `path` (JSON), atomically, replacing only a
  record of the same kind (`check_record_path`).

  Args:
    path: the record's file.
    record: its fields, `kind` among them.

  Raises:
    ValueError: `path` holds something else.
    WorkdirError: the disk is full (`atomic_write`), the record left as it was.
  """
  check_record_path(path, record['kind'])
  with atomic_write(path) as f:
    json.dump(record, f, indent=1)
    f.write('\n')


def pages() -> List[str]:
  """README.md and every Markdown page under docs/."""
  found = [os.path.join(ROOT, 'README.md')]
  for folder, _, names in sorted(os.walk(os.path.join(ROOT, 'docs'))):
    found += sorted(os.path.join(folder, n) for n in names if n.endswith('.md'))
  return found


def stale_regions(path: str) -> List[str]:
  """The records whose regions on the page `path` are not what they give."""
  with open(path) as f:
    text = f.read()
  return [m['name'] for m in REGION.finditer(text) if m['text'] != region_text(m['name'])]


def rewrite(path: str) -> bool:
  """Writes the page's regions from their records; returns whether it changed."""
  with open(path) as f:
    text = f.read()
  new = REGION.sub(lambda m: m[1] + region_text(m['name']) + m[4], text)
  if new != text:
    with atomic_write(path) as f:
      f.write(new)
  return new != text


def main(argv: List[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='name the regions out of date and exit 1, writing nothing')
  args = parser.parse_args(argv)
  try:
    return _check() if args.check else _rewrite()
  except (OSError, ValueError, WorkdirError) as error:
    print(f'Error: {error}', file=sys.stderr)
    return 2


def _check() -> int:
  stale = [f'{os.path.relpath(p, ROOT)}: {name}' for p in pages() for name in stale_regions(p)]
  for line in stale:
    print(f'{line} is out of date; run python scripts/docs_figures.py')
  return 1 if stale else 0


def _rewrite() -> int:
  for path in pages():
    if rewrite(path):
      print(f'wrote {os.path.relpath(path, ROOT)}')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
