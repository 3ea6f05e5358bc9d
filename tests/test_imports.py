"""The package graph of rlcode has no circles, and deferred imports say why.

Every module's imports are read with ast, the ones inside functions included, since an import
moved into a function still ties its package to the imported one. Each module belongs to a
package (``rlcode.<package>``; a module directly under rlcode/ is its own package). A circle
between packages (A imports B and B imports A, directly or through others) fails the test with
the packages named; so does an import of an rlcode module inside a function without a comment
on its line or the line above saying why it is deferred.
"""

import ast
import io
import pathlib
import tokenize

import import_graph

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlcode"


def _module_name(path):
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _package_of(module):
  """The package a dotted rlcode module belongs to, or None outside rlcode."""
  parts = module.split(".")
  if parts[0] != "rlcode" or len(parts) < 2:
    return None
  return "rlcode." + parts[1]


def _imported_modules(node, module, is_package):
  """The dotted names an Import or ImportFrom node brings in."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  base = node.module or ""
  if node.level:
    anchor = module.split(".")
    if not is_package:
      anchor = anchor[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    base = ".".join(anchor + ([base] if base else []))
  if base == "rlcode":
    # `from rlcode import agent` names a package; `from rlcode import errors` a module.
    return [f"rlcode.{alias.name}" for alias in node.names]
  return [base]


def _in_function_imports(tree):
  """Import nodes that sit inside a function body, at any depth."""
  found = []
  for fn in ast.walk(tree):
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      for node in ast.walk(fn):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
          found.append(node)
  return found


def _comment_lines(source):
  lines = set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      lines.add(token.start[0])
  return lines


def _explained(lineno, lines, comments):
  """Whether the import at `lineno` has a comment on its line, or on the line above the
  run of import lines it belongs to (one comment may head a block of deferred imports)."""
  first = lineno
  while first > 1 and lines[first - 2].lstrip().startswith(("import ", "from ")):
    first -= 1
  return bool(comments & set(range(first - 1, lineno + 1)))


def _scan():
  """(edges, uncommented): package edges with one example each, and bare deferred imports."""
  edges = {}
  uncommented = []
  for path in sorted(PACKAGE.rglob("*.py")):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    source_package = _package_of(module) if module != "rlcode" else None
    deferred = {id(node) for node in _in_function_imports(tree)}
    comments = _comment_lines(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
      if not isinstance(node, (ast.Import, ast.ImportFrom)):
        continue
      targets = [t for t in _imported_modules(node, module, is_package) if _package_of(t)]
      where = f"{path.relative_to(ROOT)}:{node.lineno}"
      if targets and id(node) in deferred:
        if not _explained(node.lineno, lines, comments):
          uncommented.append(f"{where} imports {targets[0]}")
      for target in targets:
        target_package = _package_of(target)
        if source_package and target_package != source_package:
          edges.setdefault((source_package, target_package), where)
  return edges, uncommented


def _circles(edges):
  """Strongly connected sets of packages with more than one member."""
  graph = {}
  for a, b in edges:
    graph.setdefault(a, set()).add(b)
    graph.setdefault(b, set())
  return import_graph.cycles(graph)


def test_no_package_imports_another_that_imports_it_back():
  edges, _ = _scan()
  problems = []
  for component in _circles(edges):
    members = set(component)
    pairs = [
      f"{a} -> {b} ({where})"
      for (a, b), where in sorted(edges.items())
      if a in members and b in members
    ]
    problems.append(f"circle among {', '.join(component)}:\n    " + "\n    ".join(pairs))
  assert not problems, "\n".join(problems)


def test_imports_inside_functions_say_why():
  _, uncommented = _scan()
  assert not uncommented, (
    "imports of rlcode inside functions without a comment on the line or the line above "
    "(move them to the top of the module, or say what deferring them avoids):\n  "
    + "\n  ".join(uncommented)
  )


def test_the_scan_finds_a_circle_and_a_bare_deferred_import():
  edges = {("rlcode.a", "rlcode.b"): "x", ("rlcode.b", "rlcode.c"): "y",
             ("rlcode.c", "rlcode.a"): "z", ("rlcode.c", "rlcode.d"): "w"}
  assert _circles(edges) == [["rlcode.a", "rlcode.b", "rlcode.c"]]
  tree = ast.parse("def f():\n    from rlcode.models import build\n")
  (node,) = _in_function_imports(tree)
  assert _imported_modules(node, "rlcode.train.sft", False) == ["rlcode.models"]
  block = "def f():\n    # deferred: jax\n    import jax\n    from rlcode import models\n"
  assert _explained(4, block.splitlines(), _comment_lines(block))
  bare = "def f():\n    x = 1\n    from rlcode import models\n"
  assert not _explained(3, bare.splitlines(), _comment_lines(bare))
  relative = ast.parse("from ..models import build\n").body[0]
  assert _imported_modules(relative, "rlcode.train.sft", False) == ["rlcode.models"]
