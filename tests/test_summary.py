"""scripts/summary.py, as the quick start ends with it."""
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_start_summary_names_steps_accuracy_times_and_report(tmp_path, warm_python):
  vit, resnet, analysis = tmp_path / 'vit', tmp_path / 'resnet', tmp_path / 'analysis'
  for workdir in (vit, resnet, analysis):
    workdir.mkdir()
  (vit / 'results.json').write_text(json.dumps({
      'step': 3049, 'total_steps': 6084, 'eval_accuracy': 0.885, 'eval_loss': 0.3,
      'eval_examples': 10000, 'wall_seconds': 892.4}))
  (vit / 'budget.json').write_text(json.dumps({'time_budget': '15m'}))
  (analysis / 'timings.json').write_text(json.dumps({'hessian': 200.0, 'cka': 3.3,
                                                      'erf': 15.0, 'probes': 4.0}))
  (analysis / 'report.html').write_text('<html></html>')
  out = subprocess.run([warm_python, 'scripts/summary.py', str(vit), str(resnet),
                        '--analysis', str(analysis)], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert 'Summary (CPU: ' in out
  assert f'{vit}: 3,049 of 6,084 steps under a 15m budget, accuracy 88.5% on 10,000 images, ' \
         '14m52s' in out
  assert f'{resnet}: no results.json' in out
  assert 'analysis: 3m42s (hessian 3m20s, erf 15s, probes 4s)' in out
  assert f'report: {analysis / "report.html"}' in out


def test_the_summary_says_when_load_cut_training_short_and_what_the_budget_left_out(
    tmp_path, warm_python):
  """A run whose load average was 8 on 2 cores, with 35% of the cores, trained 602
  steps where a quiet machine trains about 602 / 0.35; a quiet run says nothing
  of load; the tools a time budget left out (without results) are named."""
  busy, quiet, analysis = tmp_path / 'busy', tmp_path / 'quiet', tmp_path / 'analysis'
  for workdir in (busy, quiet, analysis):
    workdir.mkdir()
  ended = {'step': 602, 'total_steps': 6084, 'eval_accuracy': 0.803, 'eval_loss': 0.5,
           'eval_examples': 10000, 'wall_seconds': 900.0, 'cpu_count': 2}
  (busy / 'results.json').write_text(json.dumps(dict(ended, load_average=8.0, cpu_share=0.35)))
  (quiet / 'results.json').write_text(json.dumps(dict(ended, load_average=2.2, cpu_share=0.9)))
  (analysis / 'plan.json').write_text(json.dumps({
      'hessian': {'time_budget': '15m', 'left_out': 'not fitting', 'command': 'python -m ...'},
      'erf': {'time_budget': '15m', 'left_out': 'not fitting', 'command': 'python -m ...'},
      'landscape': {'time_budget': '15m', 'options': {'points': [21, 11]}}}))
  (analysis / 'erf.json').write_text('{}')  # run later on its own: no longer left out
  out = subprocess.run([warm_python, 'scripts/summary.py', str(busy), str(quiet),
                        '--analysis', str(analysis)], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert (f'{busy}: 602 of 6,084 steps, accuracy 80.3% on 10,000 images, 15m00s; the machine '
          'was busy while it trained (load average 8.0 on 2 cores): it had 35% of the cores, '
          'where a quiet machine trains about 1,720 steps in this time') in out
  assert f'{quiet}: 602 of 6,084 steps, accuracy 80.3% on 10,000 images, 15m00s\n' in out
  assert ('left out for the time budget: hessian (the report gives the command that runs '
          'each)') in out
  assert 'report: none in' in out
