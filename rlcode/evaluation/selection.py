"""Choosing one of k samples: first, majority vote by behaviour, reward model, oracle.

For a task with n scored samples, `selector@k` is the probability that the sample a
selector picks from k samples drawn without replacement passes, averaged over the draws:
  first     the first of the k (pass@1 for every k)
  oracle    any of the k passes (pass@k, coverage: what a perfect selector reaches)
  rm        the highest score (a reward model's); ties broken uniformly at random
  majority  a sample of the largest cluster of samples that behave alike (equal outputs
            on the same inputs, rlcode.behaviour), ties between clusters broken uniformly
            at random; samples with no behaviour (they crash on every input, time out or do
            not parse) do not vote, and when none votes the pick is uniform
first, oracle and rm are exact (closed forms over the draws); majority is exact when k = n
or when few draws exist, else a seeded Monte-Carlo mean over `trials` draws.

The fraction of the gap a selector closes at k is (sel@k - pass@1) / (pass@k - pass@1).
This module only combines per-sample facts (passed, score, signature); it runs nothing.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from rlcode.evaluation.passk import pass_at_k

SELECTORS = ("first", "majority", "rm", "oracle")


def _check(passed: Sequence[bool], k: int) -> int:
  n = len(passed)
  if not 1 <= k <= n:
    raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
  return n


def first_at_k(passed: Sequence[bool], k: int) -> float:
  n = _check(passed, k)
  return float(sum(map(bool, passed)) / n)


def oracle_at_k(passed: Sequence[bool], k: int) -> float:
  n = _check(passed, k)
  return pass_at_k(n, int(sum(map(bool, passed))), k)


def best_score_at_k(scores: Sequence[float], passed: Sequence[bool], k: int) -> float:
  """Exact: over groups of equal score from the top, P(the draw's best group is g) times g's
  pass rate (within a group the pick is uniform, and every member is equally likely)."""
  n = _check(passed, k)
  if len(scores) != n:
    raise ValueError(f"{len(scores)} scores but {n} samples")
  s = np.asarray(scores, np.float64)
  if np.isnan(s).any():
    raise ValueError("best_score_at_k got NaN scores")
  p = np.asarray(passed, np.float64)
  total, above = 0.0, 0
  for value in np.unique(s)[::-1]:
    members = s == value
    size = int(members.sum())
    # P(no draw member is above the group and at least one is in it).
    prob = (math.comb(n - above, k) - math.comb(n - above - size, k)) / math.comb(n, k)
    total += prob * float(p[members].mean())
    above += size
  return total


def vote(signatures: Sequence[Hashable | None], passed: Sequence[bool]) -> float:
  """Probability that majority voting over all these samples picks a passing one.

  signatures[i] is sample i's behaviour (None: it does not vote). Samples of one cluster
  may differ in passing (behaviour is measured on other inputs than the tests), so a
  cluster contributes its pass rate.
  """
  if len(signatures) != len(passed) or not passed:
    raise ValueError(f"need equally many (>0) signatures and samples, got {len(signatures)}, "
                     f"{len(passed)}")
  p = np.asarray(passed, np.float64)
  clusters: dict[Hashable, list[int]] = collections.defaultdict(list)
  for i, sig in enumerate(signatures):
    if sig is not None:
      clusters[sig].append(i)
  if not clusters:
    return float(p.mean())
  most = max(len(m) for m in clusters.values())
  tied = [m for m in clusters.values() if len(m) == most]
  return float(np.mean([p[m].mean() for m in tied]))


def majority_at_k(signatures: Sequence[Hashable | None], passed: Sequence[bool], k: int, *,
                  trials: int = 2000, seed: int = 0) -> float:
  """`vote` averaged over draws of k of the n samples (exact if C(n, k) <= trials)."""
  n = _check(passed, k)
  if len(signatures) != n:
    raise ValueError(f"{len(signatures)} signatures but {n} samples")
  ids = _cluster_ids(signatures)
  p = np.asarray(passed, np.float64)
  if math.comb(n, k) <= trials:
    draws = itertools.combinations(range(n), k)
    return float(np.mean([_vote_ids(ids[list(d)], p[list(d)]) for d in draws]))
  rng = np.random.default_rng(seed)
  return float(np.mean([_vote_ids(ids[d], p[d])
                        for d in (rng.choice(n, k, replace=False) for _ in range(trials))]))


def _cluster_ids(signatures) -> np.ndarray:
  """Signatures as small integers (-1: no vote)."""
  index: dict[Hashable, int] = {}
  return np.array([-1 if s is None else index.setdefault(s, len(index)) for s in signatures])


def _vote_ids(ids: np.ndarray, p: np.ndarray) -> float:
  voting = ids >= 0
  if not voting.any():
    return float(p.mean())
  labels, counts = np.unique(ids[voting], return_counts=True)
  tied = labels[counts == counts.max()]
  return float(np.mean([p[ids == t].mean() for t in tied]))


def select_at_k(selector: str, k: int, passed: Sequence[bool], *,
                scores: Sequence[float] | None = None,
                signatures: Sequence[Hashable | None] | None = None, seed: int = 0) -> float:
  """selector@k of one task's samples."""
  if selector == "first":
    return first_at_k(passed, k)
  if selector == "oracle":
    return oracle_at_k(passed, k)
  if selector == "rm":
    if scores is None:
      raise ValueError("selector 'rm' needs scores")
    return best_score_at_k(scores, passed, k)
  if selector == "majority":
    if signatures is None:
      raise ValueError("selector 'majority' needs behaviour signatures")
    return majority_at_k(signatures, passed, k, seed=seed)
  raise ValueError(f"unknown selector {selector!r}; choose from {SELECTORS}")


def selection_table(groups: Mapping[str, Mapping[str, Sequence]], selectors: Sequence[str],
                    ks: Sequence[int], seed: int = 0) -> dict:
  """{"k": ks, "<sel>@k": {k: mean over tasks}, "gap_closed": {sel: {k: fraction}}} for
  per-task groups {task_id: {"passed": [...], "scores": [...], "signatures": [...]}}.

  Every task must have at least max(ks) samples. The gap fraction is None where
  pass@k = pass@1 (no gap to close).
  """
  unknown = sorted(set(selectors) - set(SELECTORS))
  if unknown:
    raise ValueError(f"unknown selector(s) {unknown}; choose from {SELECTORS}")
  short = [t for t, g in groups.items() if len(g["passed"]) < max(ks)]
  if short:
    raise ValueError(f"{len(short)} task(s) have fewer than k={max(ks)} samples, e.g. "
                     f"{short[0]!r}")
  names = list(dict.fromkeys(["first", "oracle", *selectors]))
  table: dict = {"k": list(ks), "n_tasks": len(groups)}
  for name in names:
    table[name] = {k: float(np.mean([
        select_at_k(name, k, g["passed"], scores=g.get("scores"),
                    signatures=g.get("signatures"), seed=seed + i)
        for i, g in enumerate(groups.values())])) for k in ks}
  table["gap_closed"] = {}
  for name in selectors:
    table["gap_closed"][name] = {}
    for k in ks:
      gap = table["oracle"][k] - table["first"][k]
      table["gap_closed"][name][k] = (None if gap <= 0 else
                                      (table[name][k] - table["first"][k]) / gap)
  return table


def format_table(table: Mapping, selectors: Sequence[str]) -> str:
  """Rows per selector, columns per k; then the gap fractions."""
  ks = table["k"]
  head = f"{'selector':<10}" + "".join(f"{'k=' + str(k):>9}" for k in ks)
  names = list(dict.fromkeys(["first", "oracle", *selectors]))
  lines = [f"{table['n_tasks']} tasks", head]
  lines += [f"{name + '@k':<10}" + "".join(f"{table[name][k]:9.4f}" for k in ks)
            for name in names]
  lines.append("gap closed: (sel@k - pass@1) / (pass@k - pass@1)")
  for name in selectors:
    cells = "".join("        -" if v is None else f"{v:9.3f}"
                    for v in (table["gap_closed"][name][k] for k in ks))
    lines.append(f"{name:<10}" + cells)
  return "\n".join(lines)
