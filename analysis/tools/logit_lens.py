"""The logit lens: the model's own readout (final norm, pooling and head) applied
to each layer of its residual stream, as nostalgebraist's logit lens reads a
language model's intermediate layers through its unembedding.

The stream entry is put in the place of the last one (a scale of 0 and a shift
of the entry's value on the same images, `family.sow_edited`), so the rest of
the model is the family's own code: a ViT's final LayerNorm, its class token,
pooling or MAP head, and its classifier; a ResNet's final norm, global mean and
head. An entry is read where it has the last entry's shape: every layer of a
ViT or a Mixer, the units of a ResNet's or AlterNet's last stage (earlier
stages have other widths and resolutions, and the head reads none of them).
"""
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from analysis.measures import uncertainty
from analysis.reporting import plots
from analysis.runtime.estimate import Work
from analysis.runtime.features import shard_examples
from analysis.tool import Batches, Subject, Tool, each_model, figure_path, register
from vit_jax import models
from vit_jax.models.family import SCALES, SHIFTS


def readable(subject: Subject) -> List[int]:
  """The stream entries the model's readout can take: those of the last entry's shape.

  Args:
    subject: the model.

  Returns:
    Their indices in `Layers.stream`.
  """
  stream = subject.layers.stream
  shapes = jax.eval_shape(
      lambda p, x: models.apply_with_intermediates(subject.model, {'params': p}, x,
                                                   names=stream)[1],
      subject.params, jax.ShapeDtypeStruct((1, subject.image_size, subject.image_size, 3),
                                           jnp.float32))
  last = shapes[stream[-1]].shape
  return [i for i, name in enumerate(stream) if shapes[name].shape == last]


def kl_divergence(reference: np.ndarray, logits: np.ndarray) -> np.ndarray:
  """KL(p_reference || p_logits) per example, in nats, from two sets of logits.

  Args:
    reference: (N, C) logits of the reference distribution (the model's own).
    logits: (N, C) logits of the other.

  Returns:
    (N,) divergences.
  """
  log_p = jax.nn.log_softmax(jnp.asarray(reference, jnp.float32), -1)
  log_q = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), -1)
  return np.asarray(jnp.sum(jnp.exp(log_p) * (log_p - log_q), -1), np.float64)


def lens_logits(subject: Subject, entries: Sequence[int]
                ) -> Callable[[Any, jax.Array], Tuple[jax.Array, List[jax.Array]]]:
  """The compiled lens: (variables, images) -> (the model's logits, the logits of its
  readout applied to each of `entries`), the entry put in place of the last
  stream entry through the `scales` and `shifts` collections.

  Args:
    subject: the model.
    entries: indices in `Layers.stream` of the shape of the last entry (`readable`).

  Returns:
    The function.
  """
  model, stream = subject.model, subject.layers.stream
  last = tuple(stream[-1].split('/'))
  scales = flax.traverse_util.unflatten_dict({last: np.float32(0.)})

  @jax.jit
  def lens(variables, x):
    final, inter = models.apply_with_intermediates(
        model, variables, x, names=[stream[i] for i in entries])
    return final, [model.apply({**variables, SCALES: scales, SHIFTS:
                                flax.traverse_util.unflatten_dict({last: inter[stream[i]]})}, x)
                   for i in entries]
  return lens


def measure(subject: Subject, batches: Batches) -> Dict:
  """Per readable stream entry, the accuracy of the model's readout applied to it,
  the share of images where it agrees with the model's prediction and the KL
  divergence from the model's output distribution to it, on the evaluation
  split, each ± its standard error over images.

  Args:
    subject: the model.
    batches: split -> its (images, labels) batches.

  Returns:
    The model's JSON but its figures (`draw`'s): per stream entry (`layers`), its
    numbers, or null where the readout cannot take it.
  """
  stream, entries = subject.layers.stream, readable(subject)
  lens = lens_logits(subject, entries)
  correct, agree, kl = ([[] for _ in entries] for _ in range(3))
  for images, labels in batches('eval'):
    final, read = lens(subject.variables, shard_examples(images, mesh=subject.mesh))
    final = np.asarray(final)
    for k, logits in enumerate(read):
      logits = np.asarray(logits)
      correct[k].append(logits.argmax(-1) == np.asarray(labels))
      agree[k].append(logits.argmax(-1) == final.argmax(-1))
      kl[k].append(kl_divergence(final, logits))
  correct, agree, kl = ([np.concatenate(c).astype(np.float64) for c in v]
                        for v in (correct, agree, kl))
  n = len(correct[0])
  accuracy, accuracy_se, agreement, agreement_se, divergence, divergence_se = (
      [None] * len(stream) for _ in range(6))
  for k, i in enumerate(entries):
    accuracy[i] = float(correct[k].mean())
    accuracy_se[i] = float(uncertainty.binomial_stderr(accuracy[i], n))
    agreement[i] = float(agree[k].mean())
    agreement_se[i] = float(uncertainty.binomial_stderr(agreement[i], n))
    divergence[i] = float(kl[k].mean())
    divergence_se[i] = float(kl[k].std(ddof=1) / np.sqrt(n)) if n > 1 else 0.
  return {'layers': list(subject.layers.labels),
          'accuracy': accuracy, 'accuracy_stderr': accuracy_se,
          'agreement': agreement, 'agreement_stderr': agreement_se,
          'kl': divergence, 'kl_stderr': divergence_se,
          'first_agreeing_layer': next((subject.layers.labels[i] for i in entries
                                        if agreement[i] >= 0.5), None),
          'num_images': n}


def draw(result: Mapping, subject: Subject, out: str) -> List[str]:
  """The figure of the tool's numbers (`measure`): each entry's accuracy and agreement with the output, none where the readout cannot take it.

  See `analysis.tool.Draw`.
  """
  nan = lambda key: np.array([np.nan if v is None else v for v in result[key]])
  return [plots.curves(
      {'accuracy': nan('accuracy'), 'agreement with the output': nan('agreement')},
      figure_path(out, 'logit_lens', subject), f'Logit lens: {subject.label}', 'layer',
      'share of images', xlabels=subject.layers.labels, stages=subject.layers.stages,
      errors={'accuracy': nan('accuracy_stderr'),
              'agreement with the output': nan('agreement_stderr')})]


def _findings(label, r, q):
  entries = [i for i, a in enumerate(r['accuracy']) if a is not None]
  first = entries[0]
  text = [f'{label}: the readout on {len(entries)} of {len(r["layers"])} stream entries; at '
          f'{r["layers"][first]} accuracy ', q('accuracy', first), ' ± ',
          q('accuracy_stderr', first), ', KL to the output ', q('kl', first), ' nats; ']
  if r['first_agreeing_layer'] is None:
    return text + ['no layer before the output agrees with it on half the images']
  at = r['layers'].index(r['first_agreeing_layer'])
  return text + [f'it first agrees with the output on half the images at {r["layers"][at]} (',
                 q('agreement', at), ')']


TOOL = register(Tool(
    name='logit_lens', importance=17, title='Logit lens',
    quantity="The model's own readout (final norm, pooling or class token, head) applied to "
             'each residual-stream entry of the shape the readout takes, in place of the last '
             'one: accuracy on the evaluation split, the share of images where it agrees with '
             "the model's prediction (each ± its binomial standard error) and the mean KL "
             "divergence from the model's output distribution to it (± its standard error "
             'over images).',
    paper="No claim of the two papers: beside Raghu et al.'s per-layer linear probes (Fig. "
          '12), which train a new readout per layer, this reads each layer through the one '
          'the model trained (nostalgebraist 2020, "interpreting GPT: the logit lens").',
    reads_logits=True,
    run=measure, draw=draw, findings=each_model(_findings),
    scalars=lambda result, label: ({'logit_lens/agreement': [
        a for a in result[label]['agreement'] if a is not None]} if label in result else {}),
    # The intact pass, then one pass per readable entry, all in one program.
    work=lambda subject, options, amounts: Work(
        {'forward': (1 + len(readable(subject))) * amounts.batches},
        {'forward': 1 + len(readable(subject))})))
