"""Behaviour signatures: the inputs read from tests and prompts, frozen outcomes."""

import pytest

from rlcode import behaviour
from rlcode.data.tasks import Task

TASK = Task(
    id="t", entry_point="scale",
    prompt='def scale(xs, k):\n    """Scale.\n    >>> scale([1, 2], 3)\n    [3, 6]\n'
           '    >>> scale(not_literal, 2)\n    >>> broken(\n    >>> scale([], 0)\n    """\n',
    tests="def check(candidate):\n    assert candidate([1, 2], 3) == [3, 6]\n"
          "    assert candidate((1,), -1) == [-1]\n    x = [5]\n    assert candidate(x, 2) == [10]\n"
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


def test_signatures_are_equal_exactly_when_outcomes_are():
  ok = lambda *values: [("ok", v) for v in values]
  sig = behaviour.signature
  assert sig(ok([1, 2], {"a": {1, 2}})) == sig(ok([1, 2], {"a": {2, 1}}))
  assert sig(ok([1, 2])) != sig(ok((1, 2)))  # a list is not a tuple
  assert sig(ok(1)) == sig(ok(1.0))  # equal numbers are equal outputs, as == says
  assert sig(ok(float("nan"))) == sig(ok(float("nan")))
  assert sig(ok(1) + [("error", "ZeroDivisionError")]) != sig(ok(1) + [("error", "TypeError")])
  hash(sig(ok([{1: [2]}], {frozenset({1}): (None, b"x")})))
  # No behaviour: did not run, no inputs, or raised on every input.
  assert sig(None) is None and sig([]) is None
  assert sig([("error", "NameError"), ("error", "NameError")]) is None
