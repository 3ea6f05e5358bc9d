"""Selectors against brute force over every draw of k samples; majority vote on hand-made
groups (ties, crashes, mixed clusters); gap fractions by hand."""

import itertools

import numpy as np
import pytest

from rlcode import evaluate, selection


def _brute(pick, n, k):
  """Mean over every k-subset of the expected pass of `pick(subset)`."""
  return np.mean([pick(list(d)) for d in itertools.combinations(range(n), k)])


PASSED = [1, 0, 0, 1, 0, 1, 0]
SCORES = [0.5, 2.0, 2.0, 2.0, -1.0, 0.5, 3.0]  # ties at 2.0 and 0.5


@pytest.mark.parametrize("k", range(1, 8))
def test_rm_first_and_oracle_against_brute_force(k):
  n = len(PASSED)
  p, s = np.array(PASSED, float), np.array(SCORES)

  def best(d):
    top = max(s[d])
    return np.mean([p[i] for i in d if s[i] == top])
  assert selection.best_score_at_k(SCORES, PASSED, k) == pytest.approx(_brute(best, n, k))
  # "first" is the first sample drawn: over ordered draws, not sorted subsets.
  first = np.mean([p[d[0]] for d in itertools.permutations(range(n), k)])
  assert selection.first_at_k(PASSED, k) == pytest.approx(first)
  assert selection.oracle_at_k(PASSED, k) == pytest.approx(_brute(lambda d: p[d].max(), n, k))
  assert selection.oracle_at_k(PASSED, k) == evaluate.pass_at_k(n, 3, k)


def test_vote_on_hand_made_groups():
  A, B, C = ("ok", 1), ("ok", 2), ("ok", 3)
  # Three programs that crash everywhere (None) outnumber each cluster but do not vote.
  assert selection.vote([A, A, B, None, None, None], [1, 1, 0, 0, 0, 0]) == 1.0
  # A tie between two clusters: either is picked with probability 1/2.
  assert selection.vote([A, B, A, B], [1, 0, 1, 0]) == 0.5
  assert selection.vote([A, B, C], [1, 0, 0]) == pytest.approx(1 / 3)
  # A cluster whose members differ on the tests contributes its pass rate.
  assert selection.vote([A, A, A, B], [1, 0, 1, 1]) == pytest.approx(2 / 3)
  # Nobody votes: a uniform pick.
  assert selection.vote([None, None, None, None], [1, 0, 0, 0]) == 0.25
  # Crashing the same way on some inputs is a behaviour like any other.
  part = (("ok", 1), ("error", "ZeroDivisionError"))
  assert selection.vote([part, part, A], [0, 0, 1]) == 0.0
  with pytest.raises(ValueError):
    selection.vote([A], [1, 0])


@pytest.mark.parametrize("k", [1, 2, 3, 5, 6])
def test_majority_at_k_exact_against_brute_force(k):
  A, B = "a", "b"
  sigs = [A, A, B, None, B, A]
  passed = [1, 1, 0, 0, 0, 0]
  expect = _brute(lambda d: selection.vote([sigs[i] for i in d], [passed[i] for i in d]), 6, k)
  assert selection.majority_at_k(sigs, passed, k) == pytest.approx(expect)


def test_majority_at_k_monte_carlo_is_close_to_exact():
  rng = np.random.default_rng(0)
  sigs = [int(x) if x < 4 else None for x in rng.integers(0, 6, 24)]
  passed = [int(s == 0) for s in sigs]
  exact = selection.majority_at_k(sigs, passed, 4, trials=10**6)  # C(24, 4) = 10626 draws
  mc = selection.majority_at_k(sigs, passed, 4, trials=4000, seed=1)
  assert abs(mc - exact) < 4 * 0.5 / np.sqrt(4000)  # four standard errors at most


def test_selection_table_and_gap_fractions():
  groups = {
      "t1": {"passed": [1, 0, 0, 0], "scores": [3.0, 1.0, 2.0, 0.0],
             "signatures": ["a", "b", "b", None]},
      "t2": {"passed": [0, 0, 1, 1], "scores": [0.0, 1.0, 2.0, 3.0],
             "signatures": ["x", "y", "z", "z"]},
  }
  table = selection.selection_table(groups, ["majority", "rm"], [1, 4])
  assert table["first"][4] == pytest.approx(0.375)
  assert table["oracle"][4] == 1.0
  assert table["rm"][4] == 1.0  # the top score passes in both tasks
  assert table["majority"][4] == pytest.approx(0.5)  # t1's "b" cluster wins, t2's "z"
  assert table["gap_closed"]["rm"][4] == pytest.approx(1.0)
  assert table["gap_closed"]["majority"][4] == pytest.approx((0.5 - 0.375) / (1 - 0.375))
  assert table["gap_closed"]["rm"][1] is None  # pass@1 = first@1: no gap
  text = selection.format_table(table, ["majority", "rm"])
  assert "rm@k" in text and "gap closed" in text
  with pytest.raises(ValueError, match="fewer than k=8"):
    selection.selection_table(groups, ["rm"], [8])
  with pytest.raises(ValueError, match="unknown selector"):
    selection.selection_table(groups, ["best"], [1])
