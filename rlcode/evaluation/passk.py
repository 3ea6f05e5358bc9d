"""pass@k by the unbiased estimator, majority vote and best-of-n: arithmetic on counts only.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Sequence
import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one task with n samples, c of them correct.

  1 - C(n-c, k) / C(n, k) (Chen et al. 2021), computed as the product
  1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms huge binomials.
  """
  if not 0 <= c <= n:
    raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
  """pass@k averaged over tasks, with ns[i] samples and cs[i] correct for task i."""
  if len(ns) != len(cs) or not len(ns):
    raise ValueError(f"need equally many (>0) sample and correct counts, got {len(ns)}, {len(cs)}")
  return float(np.mean([pass_at_k(n, c, k) for n, c in zip(ns, cs)]))


def majority_vote(answers: Sequence[Hashable]) -> Hashable:
  """The most frequent answer; ties go to the one seen first."""
  if not answers:
    raise ValueError("majority_vote of no answers")
  return collections.Counter(answers).most_common(1)[0][0]


def best_of_n(scores: Sequence[float]) -> int:
  """Index of the highest score (the first on ties), for best-of-n selection."""
  values = np.asarray(scores, np.float64)
  if values.ndim != 1 or not values.size:
    raise ValueError(f"best_of_n needs a non-empty 1-D sequence, got shape {values.shape}")
  if np.isnan(values).any():
    raise ValueError("best_of_n got NaN scores")
  return int(np.argmax(values))
