"""Representational similarity analysis (Kriegeskorte, Mur & Bandettini 2008,
"Representational similarity analysis: connecting the branches of systems
neuroscience")."""
import numpy as np
import scipy.stats


def dissimilarity_matrix(x: np.ndarray) -> np.ndarray:
  """The representational dissimilarity matrix: 1 - the Pearson correlation
  between the activity patterns of each pair of examples (the paper's
  "correlation distance").

  Args:
    x: (n, ...) a representation of n examples.

  Returns:
    The (n, n) matrix, 0 on the diagonal.
  """
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  return 1. - np.corrcoef(x)


def rsa(x: np.ndarray, y: np.ndarray) -> float:
  """The Spearman rank correlation between the upper triangles (off the diagonal)
  of the two representations' dissimilarity matrices, the paper's comparison of
  RDMs (rank correlation, as dissimilarities need not be linearly related).

  Args:
    x: (n, ...) the first representation, n examples.
    y: (n, ...) the second.

  Returns:
    The correlation, in [-1, 1].
  """
  upper = np.triu_indices(len(x), k=1)
  return float(scipy.stats.spearmanr(dissimilarity_matrix(x)[upper],
                                     dissimilarity_matrix(y)[upper]).statistic)
