"""rlcode.pyast: parsing behind a lock, and the retry of CPython 3.11's thread collision."""

import ast

import pytest

from rlcode import pyast


COLLISION = "AST constructor recursion depth mismatch (before=1, after=2)"


def _flaky(monkeypatch, failures, message=COLLISION):
  calls = []
  real = ast.literal_eval

  def fake(text):
    calls.append(text)
    if len(calls) <= failures:
      raise SystemError(message)
    return real(text)
  monkeypatch.setattr(ast, "literal_eval", fake)
  return calls


def test_results_are_ast_results():
  assert pyast.literal_eval("(1, 'a', [2.5])") == (1, "a", [2.5])
  assert ast.dump(pyast.parse("x = 1")) == ast.dump(ast.parse("x = 1"))
  with pytest.raises(SyntaxError):
    pyast.parse("def (")


def test_a_collision_is_retried(monkeypatch):
  calls = _flaky(monkeypatch, failures=2)
  assert pyast.literal_eval("7") == 7
  assert len(calls) == 3


def test_a_lasting_collision_and_other_errors_raise(monkeypatch):
  calls = _flaky(monkeypatch, failures=100)
  with pytest.raises(SystemError, match="mismatch"):
    pyast.literal_eval("7")
  assert len(calls) == pyast._RETRIES + 1
  calls = _flaky(monkeypatch, failures=1, message="something else")
  with pytest.raises(SystemError, match="something else"):
    pyast.literal_eval("7")
  assert len(calls) == 1
