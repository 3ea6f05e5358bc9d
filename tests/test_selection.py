"""Selectors against brute force over every draw of k samples; majority vote on hand-made
groups (ties, crashes, mixed clusters); gap fractions by hand."""

import itertools
import json

import numpy as np
import pytest

from rlcode import cli
from rlcode.evaluation import selection
from rlcode.evaluation import passk


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
  assert selection.oracle_at_k(PASSED, k) == passk.pass_at_k(n, 3, k)


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


PROBLEMS = [
    {"id": "p/inc", "prompt": "def inc(x):\n", "entry_point": "inc",
     "reference": "    return x + 1\n",
     "tests": "def check(candidate):\n    assert candidate(1) == 2\n"
              "    assert candidate(-1) == 0\n"},
    {"id": "p/neg", "prompt": "def neg(x):\n", "entry_point": "neg", "reference": "    return -x\n",
     "tests": "def check(candidate):\n    assert candidate(3) == -3\n"},
]
SAMPLES = [("p/inc", "    return x + 1\n"), ("p/inc", "    return 1 + x\n"),
           ("p/inc", "    return x + 2\n"), ("p/inc", "    return (\n"),
           ("p/neg", "    return 0 - x\n"), ("p/neg", "    return x\n"),
           ("p/neg", "    return x * 1\n"), ("p/neg", "    return -x\n")]


def _files(tmp_path):
  tasks = tmp_path / "problems.jsonl"
  tasks.write_text("".join(json.dumps({**p, "split": "train"}) + "\n" for p in PROBLEMS))
  samples = tmp_path / "samples.jsonl"
  samples.write_text("".join(json.dumps({"task_id": t, "completion": c}) + "\n"
                             for t, c in SAMPLES))
  return str(tasks), str(samples)


def test_majority_by_behaviour_through_the_cli(tmp_path, capsys):
  tasks, samples = _files(tmp_path)
  assert cli.main(["eval", "--tasks", tasks, "--completions", samples, "--select",
                   "majority,oracle", "--k", "1,4", "--workers", "2"]) == 0
  out = capsys.readouterr().out
  # p/inc: "x + 1" and "1 + x" behave alike and outvote "x + 2" (the syntax error has no
  # vote): 1.0; p/neg: "0 - x" and "-x" tie with "x" and "x * 1": 0.5.
  rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if "@k" in line}
  assert [float(v) for v in rows["first@k"]] == [0.5, 0.5]
  assert [float(v) for v in rows["oracle@k"]] == [0.5, 1.0]
  assert [float(v) for v in rows["majority@k"]] == [0.5, 0.75]
  assert "gap closed" in out


@pytest.mark.parametrize("argv,needle", [
    (["--select", "best"], "unknown selector(s) ['best']"),
    (["--select", "rm"], "--select rm needs --rm"),
    (["--select", "majority", "--k", "1,8"], "only 4 samples"),
])
def test_selection_errors_are_one_line(tmp_path, capsys, argv, needle):
  tasks, samples = _files(tmp_path)
  assert cli.main(["eval", "--tasks", tasks, "--completions", samples, *argv]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and needle in err and "Traceback" not in err
