"""Test plans: tests split by AST into units the harness reports one by one."""

from __future__ import annotations

import pytest

from rlcode.sandbox import plan_tests
from rlcode.sandbox.testplan import context_names


def test_plan_splits_humaneval_style_check():
  tests = ("METADATA = {}\n\ndef check(candidate):\n    import math\n"
           "    assert True, 'always'\n    assert candidate(1) == 1\n"
           "    for i in range(3):\n        assert candidate(i) == i\n"
           "    def helper(v):\n        assert v\n    helper(candidate(1))\n")
  plan = plan_tests(tests, "f")
  assert plan.format == "generator" and plan.n_tests == 2
  assert plan.labels == ("assert candidate(1) == 1", "for i in range(3):")
  assert {"METADATA", "candidate", "helper", "i", "range", "v"} <= set(plan.names)
  compile(plan.source, "<plan>", "exec")
  no_asserts = ("def check(candidate):\n    x = candidate(1)\n"
                "    if x != 1:\n        raise ValueError\n")
  assert plan_tests(no_asserts, "f").n_tests == 1


@pytest.mark.parametrize("tests,entry_point,fmt,message", [
    ("def check(candidate):\n    assert candidate(1)\n", "", "auto", "entry point"),
    ("assert f(1) ==\n", "", "auto", "do not parse"),
    ("# nothing\n", "", "auto", "no test statements"),
    ("", "", "auto", "non-empty"),
    ("assert f(1)\n", "", "pytest", "tests_format"),
    ("import unittest\nclass T(unittest.TestCase):\n    def helper(self):\n        pass\n",
     "", "unittest", "no TestCase method"),
])
def test_plan_rejects_bad_tests(tests, entry_point, fmt, message):
  with pytest.raises(ValueError, match=message):
    plan_tests(tests, entry_point, fmt)


def test_context_names_and_bad_context():
  assert context_names("import math\ndef poly(xs, x):\n    return math.fsum(xs) * x\n") == (
      "math", "x", "xs")
  assert context_names("") == ()
  with pytest.raises(ValueError, match="context does not parse"):
    context_names("def (")
