"""Test plans: tests split by AST into individually counted units.

`plan_tests` turns a task's tests (HumanEval `check`, a script of asserts, a
sequence of snippets, or unittest classes) into a `TestPlan` whose source the
harness runs and reports test by test. It only parses the tests (never runs
them) and knows nothing of launchers or reports.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Sequence

from rlcode import pyast

TEST_FORMATS = ("auto", "check", "script", "unittest")

# Names the test plan defines in the tests' namespace; unlikely to collide.
GEN_NAME = "__rlcode_tests__"
_ERR_NAME = "__rlcode_error__"


@dataclasses.dataclass(frozen=True)
class TestPlan:
  """Tests rewritten so the harness can report each one.

  `source` is executed in the tests' own namespace, where the program's names
  it uses are proxies (see harness.py). For the "generator" format it defines
  `__rlcode_tests__(*args)`, a generator that runs the setup statements in order
  and wraps each test in try/except, yielding `(index, exception or None)`; for
  "unittest" it is the test module as given and `cases` lists the (class,
  method) pairs to run.
  """

  __test__ = False  # not a pytest class

  format: str
  source: str
  labels: tuple[str, ...]
  entry_point: str = ""
  cases: tuple[tuple[str, str], ...] = ()
  names: tuple[str, ...] = ()  # the identifiers the tests use (see `names_in`)

  @property
  def n_tests(self) -> int:
    return len(self.labels)


def names_in(tree: ast.AST) -> tuple[str, ...]:
  """Every plain identifier `tree` reads or binds (ast.Name), sorted.

  The harness asks the program for those of them it defines (builtins aside).
  """
  return tuple(sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}))


@functools.lru_cache(maxsize=4096)
def context_names(context: str) -> tuple[str, ...]:
  """`names_in` a job's context source; ValueError if it does not parse."""
  try:
    return names_in(pyast.parse(context))
  except SyntaxError as e:
    raise ValueError(f"the context does not parse: {e}") from e


def _is_test(stmt: ast.stmt) -> bool:
  """Whether `stmt` asserts something; asserts of a constant (`assert True`) do not count."""
  if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return False
  stack: list[ast.AST] = [stmt]
  while stack:
    node = stack.pop()
    if isinstance(node, ast.Assert) and not isinstance(node.test, ast.Constant):
      return True
    stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(
        c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
  return False


def _label(stmts: Sequence[ast.stmt]) -> str:
  text = " ".join(ast.unparse(s).splitlines()[0] for s in stmts)
  return text if len(text) <= 100 else text[:97] + "..."


def _wrap(stmts: list[ast.stmt], index: int) -> ast.stmt:
  def yield_(value: ast.expr) -> ast.stmt:
    return ast.Expr(ast.Yield(ast.Tuple([ast.Constant(index), value], ast.Load())))
  return ast.Try(
      body=stmts,
      handlers=[ast.ExceptHandler(
          type=ast.Name("BaseException", ast.Load()), name=_ERR_NAME,
          body=[yield_(ast.Name(_ERR_NAME, ast.Load()))])],
      orelse=[yield_(ast.Constant(None))], finalbody=[])


def _generator_plan(units: list[list[ast.stmt]], args: ast.arguments,
                    preamble: list[ast.stmt], entry_point: str, what: str) -> TestPlan:
  """Builds the generator source from units (lists of statements) in order."""
  # `from m import *` is only legal at module level.
  hoisted = [s for u in units for s in u
             if isinstance(s, ast.ImportFrom) and any(a.name == "*" for a in s.names)]
  units = [[s for s in u if s not in hoisted] for u in units]
  units = [u for u in units if u]
  tests = [u for u in units if any(_is_test(s) for s in u)]
  if not tests:
    if not units:
      raise ValueError(f"{what}: no test statements")
    units = [[s for u in units for s in u]]
    tests = units
  body: list[ast.stmt] = []
  labels = []
  for unit in units:
    if any(unit is t for t in tests):
      body.append(_wrap(unit, len(labels)))
      labels.append(_label(unit))
    else:
      body.extend(unit)
  gen = ast.FunctionDef(name=GEN_NAME, args=args, body=body, decorator_list=[],
                        returns=None, type_comment=None)
  module = ast.Module(body=[*preamble, *hoisted, gen], type_ignores=[])
  ast.fix_missing_locations(module)
  return TestPlan("generator", ast.unparse(module), tuple(labels), entry_point,
                  names=names_in(module))


def _no_args() -> ast.arguments:
  return ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                       kw_defaults=[], kwarg=None, defaults=[])


def _parse(source: str, what: str) -> ast.Module:
  try:
    return pyast.parse(source)
  except SyntaxError as e:
    raise ValueError(f"{what}: the tests do not parse: {e}") from e


def _testcase_classes(module: ast.Module) -> list[ast.ClassDef]:
  def is_testcase(base: ast.expr) -> bool:
    name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
    return name.endswith("TestCase")
  return [s for s in module.body
          if isinstance(s, ast.ClassDef) and any(is_testcase(b) for b in s.bases)]


@functools.lru_cache(maxsize=4096)
def plan_tests(tests: str | tuple[str, ...], entry_point: str = "",
               tests_format: str = "auto") -> TestPlan:
  """Splits tests into individually counted units.

  Formats:
    check: HumanEval style, a module defining `check(candidate)`; the harness
      calls it with the program's `entry_point`. Each top-level statement of
      check's body that asserts something (an assert anywhere inside it, outside
      nested defs, of a non-constant) is one test; the other statements are
      setup, kept in order. If none asserts directly, the whole body is one test.
      The rest of the module (METADATA, imports, helpers) runs first.
    script: a module (or a sequence of snippets) of top-level statements, for
      example a list of asserts; split the same way, each snippet of a sequence
      being one unit.
    unittest: classes deriving from `*TestCase`; each method named `test*`
      defined in such a class is one test.
    auto: a sequence -> script; a module with TestCase classes -> unittest;
      one defining `check` -> check; otherwise script.

  Args:
    tests: test source, or a tuple of snippets (script format).
    entry_point: function passed to `check`; required for the check format.
    tests_format: one of TEST_FORMATS.

  Raises:
    ValueError: unknown format, tests that do not parse, no tests found, or a
      check-style plan without an entry point.
  """
  if tests_format not in TEST_FORMATS:
    raise ValueError(f"tests_format must be one of {TEST_FORMATS}, got {tests_format!r}")
  if isinstance(tests, tuple):
    if tests_format not in ("auto", "script"):
      raise ValueError(f"a sequence of test snippets is script format, not {tests_format!r}")
    if not tests:
      raise ValueError("empty sequence of test snippets")
    units = [_parse(t, f"test snippet {i}").body for i, t in enumerate(tests)]
    return _generator_plan(units, _no_args(), [], "", "test snippets")
  if not isinstance(tests, str) or not tests.strip():
    raise ValueError(f"tests must be non-empty source or a tuple of snippets, got {tests!r:.80}")
  module = _parse(tests, "tests")
  if tests_format == "auto":
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if _testcase_classes(module):
      tests_format = "unittest"
    elif checks:
      tests_format = "check"
    else:
      tests_format = "script"
  if tests_format == "unittest":
    cases = tuple((c.name, s.name) for c in _testcase_classes(module) for s in c.body
                  if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and s.name.startswith("test"))
    if not cases:
      raise ValueError("unittest-format tests define no TestCase method named test*")
    return TestPlan("unittest", tests, tuple(f"{c}.{m}" for c, m in cases), "", cases,
                    names_in(module))
  if tests_format == "check":
    if not entry_point:
      raise ValueError("check-format tests need an entry point")
    checks = [s for s in module.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not checks:
      raise ValueError("check-format tests define no top-level `def check`")
    check = checks[-1]
    preamble = [s for s in module.body if s is not check]
    return _generator_plan([[s] for s in check.body], check.args, preamble,
                           entry_point, "check()")
  return _generator_plan([[s] for s in module.body], _no_args(), [], "", "tests")

