"""An analysis tool defined outside the `analysis` package, for
tests/test_tool_registry.py: importing this module registers it, as
`python -m analysis --tool_modules=logit_margin_tool` does."""
import dataclasses

import numpy as np

from analysis.reporting import plots
from analysis.tool import Tool, each_model, figure_path, model_scalars, register
from analysis.tool_options import option


@dataclasses.dataclass(frozen=True)
class Options:
  logit_margin_rank: int = option(2, 'The margin is to the logit of this rank (2: the '
                                  'runner-up).', least=2)


def measure(subject, batches, options=Options()):
  """Per image, the top logit minus the one of rank `logit_margin_rank`, over the
  evaluation split."""
  margins = []
  for images, _ in batches('eval'):
    top = np.sort(np.asarray(subject.logits(images)), axis=-1)[:, -options.logit_margin_rank:]
    margins.append(top[:, -1] - top[:, 0])
  return {'margins': np.concatenate(margins).tolist()}


def draw(entry, subject, out, options=Options()):
  """The histogram of one model's margins, from its numbers."""
  return [plots.histogram(np.asarray(entry['margins']), figure_path(out, 'logit_margin', subject),
                          f'Logit margins: {subject.label}', 'margin')]


LOGIT_MARGIN = register(Tool(
    name='logit_margin', title='Logit margins',
    quantity='Top logit minus the runner-up, per evaluation image.',
    paper='No paper: a tool registered by a test.',
    run=measure, draw=draw, options=Options,
    findings=each_model(lambda label, r, q: [f'{label}: mean margin ',
                                             q('margins', reduce='mean')]),
    scalars=model_scalars(lambda r: {'logit_margin/margin': r['margins'][:3]})))
