"""pass@k against exact binomials, vote helpers, completions files and their errors."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from rlcode.evaluation import passk
from rlcode.evaluation import scoring
from rlcode.data.tasks import Task

TASKS = [
    Task(id="t/add", prompt="def add(a, b):\n", tests="def check(candidate):\n"
         "    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n", entry_point="add"),
    Task(id="t/neg", prompt="def neg(x):\n", tests="assert neg(1) == -1\nassert neg(-2) == 2\n"),
]


def _exact(n, c, k):
  return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


@pytest.mark.parametrize("n", [1, 2, 5, 10, 37])
def test_pass_at_k_matches_exact_binomials(n):
  for c in range(n + 1):
    for k in range(1, n + 1):
      assert passk.pass_at_k(n, c, k) == pytest.approx(_exact(n, c, k), rel=1e-12, abs=1e-15)


def test_pass_at_k_hand_values_and_large_n():
  assert passk.pass_at_k(10, 3, 1) == pytest.approx(0.3)
  assert passk.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
  assert passk.pass_at_k(10, 0, 10) == 0.0 and passk.pass_at_k(10, 1, 10) == 1.0
  # C(1000, 100) overflows float64; the product form stays exact enough.
  assert passk.pass_at_k(1000, 1, 100) == pytest.approx(0.1, rel=1e-12)
  assert passk.pass_at_k(1000, 5, 100) == pytest.approx(_exact(1000, 5, 100), rel=1e-12)
  ns, cs = [4, 4, 10], [1, 0, 10]
  assert passk.mean_pass_at_k(ns, cs, 2) == pytest.approx(
      np.mean([1 - 3 / 6, 0.0, 1.0]))


@pytest.mark.parametrize("n,c,k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
  with pytest.raises(ValueError):
    passk.pass_at_k(n, c, k)


def test_majority_vote_and_best_of_n():
  assert passk.majority_vote(["a", "b", "b", "a", "c"]) == "a"
  assert passk.majority_vote([3, 1, 1]) == 1
  assert passk.best_of_n([0.1, 0.9, 0.9, 0.2]) == 1
  with pytest.raises(ValueError):
    passk.majority_vote([])
  with pytest.raises(ValueError, match="NaN"):
    passk.best_of_n([0.1, float("nan")])


def _write(tmp_path, lines):
  path = tmp_path / "completions.jsonl"
  path.write_text("".join(line + "\n" for line in lines))
  return path


def test_completions_file_report_and_results(tmp_path):
  rows = [("t/add", "    return a + b\n"), ("t/add", "    return a * b\n"),
          ("t/add", "    return b + a\n"), ("t/neg", "    return -x\n"),
          ("t/neg", "    return x\n"), ("t/neg", "    return 0 - x\n")]
  path = _write(tmp_path, [json.dumps({"task_id": t, "completion": c, "note": 1})
                           for t, c in rows] + [""])
  report = scoring.evaluate_completions_file(TASKS, path, out_dir=tmp_path / "out",
                                              k=(1, 2, 10), workers=2)
  assert report["pass_at_k"] == {"pass@1": pytest.approx(2 / 3),
                                 "pass@2": 1.0}  # C(1, 2) = 0: every pair holds a pass
  assert report["k_skipped"] == [10]
  assert report["tasks"] == [{"task_id": "t/add", "n": 3, "c": 2},
                             {"task_id": "t/neg", "n": 3, "c": 2}]
  written = json.loads((tmp_path / "out" / scoring.REPORT_NAME).read_text())
  assert written["pass_at_k"] == report["pass_at_k"]
  results_text = (tmp_path / "out" / scoring.RESULTS_NAME).read_text()
  results = [json.loads(line) for line in results_text.splitlines()]
  assert [(r["task_id"], r["passed"]) for r in results] == [
      ("t/add", True), ("t/add", False), ("t/add", True),
      ("t/neg", True), ("t/neg", False), ("t/neg", True)]
  assert results[1]["tests_passed"] == 1 and results[1]["tests_total"] == 2
  assert "pass@1" in scoring.format_report(report)


@pytest.mark.parametrize("lines,message", [
    (['{"task_id": "t/add", "completion": ""}', "{oops"], r":2: not valid JSON"),
    (['{"task_id": "t/add", "completion": ""}', '"text"'], r":2: expected a JSON object"),
    (['{"task_id": "t/add"}'], r":1: missing key 'completion'"),
    (['{"completion": ""}'], r":1: missing key 'task_id'"),
    (['{"task_id": "t/add", "completion": 5}'], r":1: 'completion' must be a string"),
    (['{"task_id": "t/add", "completion": ""}', '', '{"task_id": "t/mul", "completion": ""}'],
     r":3: unknown task_id 't/mul'"),
    (['{"task_id": "t/add", "completion": ""}'], r"1 task\(s\) have no completion.*t/neg"),
    ([], r"no completions"),
])
def test_malformed_completions_file(tmp_path, lines, message):
  path = _write(tmp_path, lines)
  with pytest.raises(ValueError, match=message):
    scoring.evaluate_completions_file(TASKS, path, out_dir=tmp_path / "out")
