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

The answers come from the sandbox's probes (sandbox.Job.probes): the harness calls the
entry point after the tests and sends back what it returned as plain data it rebuilt
itself, or the name of the exception it raised; the host decodes data, never code, and
nothing the program defines is called here. Tests and probes share one run, so a
program's verdict and its signature come from the same execution. A signature is a tuple
of one frozen answer per input; None (no vote) when the program did not run (syntax
error, crash at import, timeout), when it raised on every input, or when the task has no
usable inputs.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from collections.abc import Hashable, Sequence

from rlcode import pyast, sandbox
from rlcode.data.tasks import Task
from rlcode.rewards.tests import HUMANEVAL_STOP, job_for

INPUT_SOURCES = ("tests", "prompt")
_DOCTEST = re.compile(r"^\s*>>>\s?(.*)$", re.MULTILINE)


def call_arguments(source: str, names: Sequence[str]) -> list[tuple]:
  """Argument tuples of the calls to any of `names` in `source` whose positional arguments
  are all literals (no keywords, no starred), in source order, without repeats."""
  try:
    tree = pyast.parse(source)
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


def signature(outputs: Sequence[tuple[str, object]]) -> Hashable | None:
  """The signature of one program's answers, in the sandbox's terms (Result.outputs):
  ("return", value), ("raise", type name) or ("large", digest) per input. None when there
  are none (it did not run, or no inputs) or it raised on every input."""
  if not outputs or all(kind == "raise" for kind, _ in outputs):
    return None
  return tuple((kind, freeze(value) if kind == "return" else value) for kind, value in outputs)


def run(tasks: Sequence[Task], completions: Sequence[str], *, inputs: str = "tests",
        workers: int | None = None, limits: sandbox.Limits | None = None,
        stop_sequences: Sequence[str] = HUMANEVAL_STOP) -> list[sandbox.Result]:
  """Each completion against its task's tests, then probed on the task's inputs, in one
  sandboxed run: the results carry the test verdict and the answers (Result.outputs)."""
  cached: dict[str, list[tuple]] = {}
  jobs = []
  for task, completion in zip(tasks, completions, strict=True):
    if task.id not in cached:
      cached[task.id] = task_inputs(task, inputs)
    job = job_for(task, completion, stop_sequences=tuple(stop_sequences))
    jobs.append(dataclasses.replace(job, probes=tuple(cached[task.id])) if job.entry_point
                else job)
  return sandbox.Sandbox(limits, workers=workers).run_many(jobs)


def signatures(tasks: Sequence[Task], completions: Sequence[str], **kwargs) -> list:
  """`signature` of each completion's answers (`run`; kwargs as there)."""
  return [signature(r.outputs) for r in run(tasks, completions, **kwargs)]
