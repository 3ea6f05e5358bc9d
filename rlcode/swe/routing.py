"""Which way mining's second runner runs a test, and where its def is: read from the tree's
text, never from what a test process says (rlcode.swe.crosscheck's docstring says why).

`route(files, node)` is "direct" for a module-level test function or a method of a class,
found as a `def` in the file, taking no argument (besides self) but those one hypothesis
`given` supplies, with no decorator but hypothesis's, in a module and class without pytest
marks, autouse fixtures or xunit setup, and no conftest.py on the way from the root; every
other test is "pytest". `find(files, node)` is the qualified name and first line of the def
that a node runs. This module must not run anything.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Mapping

ROUTES = ("direct", "pytest")
_HYPOTHESIS = frozenset({"given", "settings", "example", "seed"})
_XUNIT = frozenset({"setup_module", "teardown_module", "setUpModule", "tearDownModule",
                    "setup_function", "teardown_function", "setup_method", "teardown_method",
                    "setup_class", "teardown_class", "setup", "teardown"})


def route(files: Mapping[str, str], node: str) -> str:
  """"direct" or "pytest": how the second runner runs `node` (module docstring)."""
  path, _, rest = node.partition("::")
  names = rest.split("::") if rest else []
  if "[" in node or not 1 <= len(names) <= 2 or path not in files:
    return "pytest"
  parts = path.split("/")[:-1]
  if any(posixpath.join(*parts[:i], "conftest.py") in files for i in range(len(parts) + 1)):
    return "pytest"
  try:
    module = ast.parse(files[path])
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return "pytest"
  if not _plain_scope(module.body):
    return "pytest"
  found = _last_def(module.body, names[0])
  if len(names) == 1:
    return "direct" if _plain_test(found, 0) else "pytest"
  if not isinstance(found, ast.ClassDef) or found.decorator_list or not _plain_scope(found.body):
    return "pytest"
  return "direct" if _plain_test(_last_def(found.body, names[1]), 1) else "pytest"


def _last_def(body: list[ast.stmt], name: str) -> ast.stmt | None:
  """The statement that last binds `name` in `body`, when that is a def or class; None
  when anything else binds it last (an import, an assignment)."""
  last = None
  for stmt in body:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      if stmt.name == name:
        last = stmt
    elif any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
             for n in ast.walk(stmt)) or isinstance(stmt, (ast.Import, ast.ImportFrom)) and any(
                 (a.asname or a.name.split(".")[0]) == name for a in stmt.names):
      last = None
  return last


def _decorator_name(node: ast.expr) -> str:
  node = node.func if isinstance(node, ast.Call) else node
  return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _plain_scope(body: list[ast.stmt]) -> bool:
  """A module or class body without pytest marks, autouse fixtures or xunit setup."""
  for stmt in body:
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
      targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
      if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
        return False
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if stmt.name in _XUNIT or any(_autouse(d) for d in stmt.decorator_list):
        return False
  return True


def _autouse(decorator: ast.expr) -> bool:
  """A fixture decorator that may be autouse (a fixture a test does not name runs only
  when autouse)."""
  return "fixture" in _decorator_name(decorator) and isinstance(decorator, ast.Call) and any(
      k.arg == "autouse" and not (isinstance(k.value, ast.Constant) and not k.value.value)
      for k in decorator.keywords)


def _plain_test(node: ast.stmt | None, selves: int) -> bool:
  """A def that runs when called with `selves` arguments and what one hypothesis `given`
  supplies (by position the rightmost arguments, or by name), nothing else: an argument
  given does not supply is a fixture, which only pytest provides."""
  if not isinstance(node, ast.FunctionDef):
    return False
  if not {_decorator_name(d) for d in node.decorator_list} <= _HYPOTHESIS:
    return False
  args = node.args
  params = [a.arg for a in args.posonlyargs + args.args][selves:]
  if len(params) + selves != len(args.posonlyargs) + len(args.args) or args.vararg or args.kwarg:
    return False
  givens = [d for d in node.decorator_list if _decorator_name(d) == "given"]
  if not givens:
    return not params and not args.kwonlyargs
  given = givens[0]
  if len(givens) > 1 or not isinstance(given, ast.Call) or any(
      isinstance(a, ast.Starred) for a in given.args) or any(k.arg is None for k in given.keywords):
    return False
  if given.args:
    return not given.keywords and not args.kwonlyargs and len(given.args) == len(params)
  return {k.arg for k in given.keywords} == set(params) | {a.arg for a in args.kwonlyargs}


def find(files: Mapping[str, str], node: str) -> tuple[str, int] | None:
  """(qualified name, first line) of the def that `node` runs, read from its file's text:
  the module's or a class's (nested classes, and a base class of the same module, followed)
  last def of that name; None when the text does not say (a test made by a factory,
  imported, or inherited from another module). Its first line is that of its first
  decorator, as in its code object."""
  path, _, rest = node.partition("::")
  names = rest.split("[", 1)[0].split("::") if rest else []
  if not names or path not in files:
    return None
  try:
    module = ast.parse(files[path])
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    return None
  return _member(module.body, module.body, names, [], 0)


def _member(top: list[ast.stmt], body: list[ast.stmt], names: list[str], qual: list[str],
            depth: int) -> tuple[str, int] | None:
  if depth > 8:
    return None
  stmt = _last_def(body, names[0])
  if len(names) == 1:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
      return ".".join(qual + names), min([stmt.lineno] + [d.lineno for d in stmt.decorator_list])
    return None
  if not isinstance(stmt, ast.ClassDef):
    return None
  found = _member(top, stmt.body, names[1:], qual + [names[0]], depth + 1)
  if found or len(names) != 2:
    return found
  for base in stmt.bases:
    if isinstance(base, ast.Name):
      found = _member(top, top, [base.id, names[1]], [], depth + 1)
      if found:
        return found
  return None
