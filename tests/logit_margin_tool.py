"""An analysis tool defined outside the `analysis` package, for
tests/test_tool_registry.py: importing this module registers it, as
`python -m analysis --tool_modules=logit_margin_tool` does."""
import numpy as np

from analysis import plots
from analysis.tool import Tool, each_model, figure_path, model_scalars, register


def run_logit_margin(subject, batches, out):
  """Per image, the top logit minus the runner-up, over the evaluation split."""
  margins = []
  for images, _ in batches('eval'):
    top2 = np.sort(np.asarray(subject.logits(images)), axis=-1)[:, -2:]
    margins.append(top2[:, 1] - top2[:, 0])
  margins = np.concatenate(margins)
  figure = plots.histogram(margins, figure_path(out, 'logit_margin', subject),
                           f'Logit margins: {subject.label}', 'margin')
  return {'margins': margins.tolist(), 'figures': [figure]}


LOGIT_MARGIN = register(Tool(
    name='logit_margin', title='Logit margins',
    quantity='Top logit minus the runner-up, per evaluation image.',
    paper='No paper: a tool registered by a test.',
    run=run_logit_margin,
    findings=each_model(lambda label, r, q: [f'{label}: mean margin ',
                                             q('margins', reduce='mean')]),
    scalars=model_scalars(lambda r: {'logit_margin/margin': r['margins'][:3]})))
