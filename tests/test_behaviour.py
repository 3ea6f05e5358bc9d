"""Behaviour signatures: the inputs read from tests and prompts, frozen outcomes."""

import pytest

from rlcode.evaluation import behaviour
from rlcode import sandbox
from rlcode.data.tasks import Task

TASK = Task(
    id="t", entry_point="scale",
    prompt='def scale(xs, k):\n    """Scale.\n    >>> scale([1, 2], 3)\n    [3, 6]\n'
           '    >>> scale(not_literal, 2)\n    >>> broken(\n    >>> scale([], 0)\n    """\n',
    tests="def check(candidate):\n    assert candidate([1, 2], 3) == [3, 6]\n"
          "    assert candidate((1,), -1) == [-1]\n    x = [5]\n"
          "    assert candidate(x, 2) == [10]\n"
          "    assert candidate([1, 2], 3) == [3, 6]\n    assert scale([0.5], k=2) == [1.0]\n"
          "    assert candidate(*[[1], 2]) == [2]\n")


def test_inputs_from_tests_and_prompt():
  # Literal arguments only, in source order, without repeats; keywords and starred skipped.
  assert behaviour.task_inputs(TASK) == [([1, 2], 3), ((1,), -1)]
  # One doctest example per line; the unparsable one and the non-literal one are skipped.
  assert behaviour.task_inputs(TASK, "prompt") == [([1, 2], 3), ([], 0)]
  assert behaviour.task_inputs(Task(id="s", prompt="", tests="assert f(1) == 2\n")) == []
  with pytest.raises(ValueError, match="expected one of"):
    behaviour.task_inputs(TASK, "generated")


def test_signatures_are_equal_exactly_when_answers_are():
  ok = lambda *values: [("return", v) for v in values]
  sig = behaviour.signature
  assert sig(ok([1, 2], {"a": {1, 2}})) == sig(ok([1, 2], {"a": {2, 1}}))
  assert sig(ok([1, 2])) != sig(ok((1, 2)))  # a list is not a tuple
  assert sig(ok(1)) == sig(ok(1.0))  # equal numbers are equal outputs, as == says
  assert sig(ok(float("nan"))) == sig(ok(float("nan")))
  assert sig(ok(1) + [("raise", "ZeroDivisionError")]) != sig(ok(1) + [("raise", "TypeError")])
  assert sig([("large", "ab" * 32)]) != sig(ok("ab" * 32))
  hash(sig(ok([{1: [2]}], {frozenset({1}): (None, b"x")})))
  # No behaviour: did not run (no answers) or raised on every input.
  assert sig(()) is None
  assert sig([("raise", "NameError"), ("raise", "NameError")]) is None


TINY = Task(id="t/add1", prompt="def add1(x):\n", entry_point="add1",
            tests="def check(candidate):\n    assert candidate(0) == 1\n"
                  "    assert candidate(5) == 6\n    assert candidate(-2) == -1\n")


def test_signatures_through_the_sandbox():
  completions = ["    return x + 1\n", "    return 1 + x\n", "    return x + 1 if x else 1\n",
                 "    return abs(x) + 1\n", "    return 1 // x\n", "    return (\n",
                 "    while True:\n        pass\n"]
  limits = sandbox.Limits(wall_seconds=10, cpu_seconds=1)
  results = behaviour.run([TINY] * 7, completions, workers=2, limits=limits)
  assert [r.passed for r in results] == [True, True, True, False, False, False, False]
  sigs = [behaviour.signature(r.outputs) for r in results]
  assert sigs[0] == sigs[1] == sigs[2] == (("return", 1), ("return", 6), ("return", -1))
  assert sigs[3] == (("return", 1), ("return", 6), ("return", 3))
  assert sigs[4] == (("raise", "ZeroDivisionError"), ("return", 0), ("return", -1))
  assert sigs[5] is None and sigs[6] is None  # a syntax error; a timeout
  assert behaviour.signatures([TINY] * 2, completions[:2], workers=1) == sigs[:2]
