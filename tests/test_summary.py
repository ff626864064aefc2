"""scripts/summary.py, as the quick start ends with it."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_start_summary_names_steps_accuracy_times_and_report(tmp_path):
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
  out = subprocess.run([sys.executable, 'scripts/summary.py', str(vit), str(resnet),
                        '--analysis', str(analysis)], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert 'Summary (CPU: ' in out
  assert f'{vit}: 3,049 of 6,084 steps under a 15m budget, accuracy 88.5% on 10,000 images, ' \
         '14m52s' in out
  assert f'{resnet}: no results.json' in out
  assert 'analysis: 3m42s (hessian 3m20s, erf 15s, probes 4s)' in out
  assert f'report: {analysis / "report.html"}' in out
