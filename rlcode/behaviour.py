"""Behaviour signatures: what a program returns on a task's inputs, for majority voting.

Two samples behave alike when their entry points return equal values (or raise the same
exception type) on the same inputs; majority voting (rlcode.selection) clusters samples by
that, not by text. The inputs (`task_inputs`) are the literal argument tuples of calls to
the entry point:
  "tests"   in the task's tests (`candidate(...)` or `<entry_point>(...)`); the expected
            values are never read, only the arguments
  "prompt"  in the prompt's doctest examples (`>>> entry_point(...)`), which a user would
            also see
Calls whose arguments are not literals (variables, comprehensions) are skipped.

Outputs come from the sandbox as plain data (rlcode.sandbox), rebuilt on this side: they
are values, never code, and nothing the program defines is called here. A signature is a
tuple of one frozen outcome per input; None (no vote) when the program did not run (syntax
error, crash at import, timeout), when it raised on every input, or when the task has no
usable inputs.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Hashable, Sequence

from rlcode.data.tasks import Task

INPUT_SOURCES = ("tests", "prompt")
_DOCTEST = re.compile(r"^\s*>>>\s?(.*)$", re.MULTILINE)


def call_arguments(source: str, names: Sequence[str]) -> list[tuple]:
  """Argument tuples of the calls to any of `names` in `source` whose positional arguments
  are all literals (no keywords, no starred), in source order, without repeats."""
  try:
    tree = ast.parse(source)
  except (SyntaxError, ValueError):
    return []
  calls = sorted((n for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                  and n.func.id in names and not n.keywords),
                 key=lambda n: (n.lineno, n.col_offset))
  found, seen = [], set()
  for node in calls:
    try:
      args = tuple(ast.literal_eval(a) for a in node.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
      continue
    if repr(args) not in seen:
      seen.add(repr(args))
      found.append(args)
  return found


def task_inputs(task: Task, source: str = "tests") -> list[tuple]:
  """The inputs a task's behaviour is measured on (see the module docstring)."""
  if source not in INPUT_SOURCES:
    raise ValueError(f"inputs={source!r}; expected one of {INPUT_SOURCES}")
  if not task.entry_point:
    return []
  if source == "tests":
    return call_arguments(task.tests, ("candidate", task.entry_point))
  found: list[tuple] = []
  for m in _DOCTEST.finditer(task.prompt):  # one example per line: a bad one spoils no other
    found += [a for a in call_arguments(m.group(1), (task.entry_point,))
              if repr(a) not in {repr(f) for f in found}]
  return found


def freeze(value) -> Hashable:
  """A hashable stand-in for a plain-data value that is equal exactly when the values are
  (containers keep their kind: a list never equals a tuple; NaN equals NaN)."""
  if isinstance(value, float) and math.isnan(value):
    return ("nan",)
  if isinstance(value, list):
    return ("list", tuple(freeze(v) for v in value))
  if isinstance(value, tuple):
    return ("tuple", tuple(freeze(v) for v in value))
  if isinstance(value, dict):
    return ("dict", frozenset((freeze(k), freeze(v)) for k, v in value.items()))
  if isinstance(value, (set, frozenset)):
    return ("set", frozenset(freeze(v) for v in value))
  if isinstance(value, complex) and (math.isnan(value.real) or math.isnan(value.imag)):
    return ("complex-nan", repr(value))
  return value


def signature(outcomes: Sequence[tuple[str, object]] | None) -> Hashable | None:
  """The signature of one program's outcomes [("ok", value) | ("error", type name)] per
  input; None when it did not run (outcomes None), has no inputs or raised on all."""
  if not outcomes or all(kind == "error" for kind, _ in outcomes):
    return None
  return tuple((kind, freeze(value) if kind == "ok" else value) for kind, value in outcomes)
