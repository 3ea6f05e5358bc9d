"""The house rules a reader relies on: one concern a file (at most 500 lines), no import
circle between modules (function-level imports count), no `config.get(key, default)` in
library code (every key has one home: rlcode.config.schema), and `rlcode` importable
beside Hugging Face's packages (its import names collide with nothing on PyPI)."""

import ast
import os
import re
import subprocess
import sys

import pytest

import import_graph

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "rlcode")


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  out = {}
  for dirpath, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  return out


def test_no_file_of_the_package_is_over_500_lines():
  long = {p: n for p in _modules().values()
          if (n := sum(1 for _ in open(p, encoding="utf-8"))) > 500}
  assert not long, long


def _imports(path: str, module: str, modules: set[str]) -> set[str]:
  """The package's modules `module` imports anywhere in its file."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      names = [base] + [f"{base}.{a.name}" for a in node.names]
    for name in names:
      # The longest module the name is, or is inside of.
      while name and name not in modules:
        name = name.rpartition(".")[0]
      if name and name != module:
        out.add(name)
  return out


def test_no_import_circle():
  modules = _modules()
  names = set(modules)
  # A package imports its submodules (re-exports): the package and what it re-exports
  # are one room, so edges into a package from its own submodules are not circles.
  graph = {}
  for module, path in modules.items():
    edges = _imports(path, module, names)
    graph[module] = {m for m in edges if not module.startswith(m + ".")}
  assert not import_graph.cycles(graph), import_graph.cycles(graph)


_CONFIG_GET = re.compile(r"\b(config|cfg|rl|ws|agent|ev|tr|rm|data_cfg|model_cfg|mining)"
                         r"(\.[a-z_]+)*\.get\(")


def test_library_code_reads_config_keys_not_defaults():
  found = []
  for module, path in _modules().items():
    if module.startswith("rlcode.config"):
      continue  # the loader reads the raw file, where absent keys mean defaults
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
      if _CONFIG_GET.search(line):
        found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
  assert not found, found


def test_the_import_names_are_ours_alone():
  """Every top-level name the project installs is `rlcode` (the kernels are
  rlcode.kernels: Hugging Face's `kernels`, which transformers 5 imports, is another)."""
  import tomllib
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    find = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]
  assert find["include"] == ["rlcode*"]
  # experiments/ is a package too, but it is run from the checkout, never installed.
  tops = {d for d in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, d, "__init__.py"))}
  assert tops - {"experiments"} == {"rlcode"}, tops


@pytest.mark.slow
def test_rlcode_and_transformers_import_together_from_the_repository_root():
  pytest.importorskip("transformers")
  pytest.importorskip("kernels")
  code = ("import transformers, kernels, rlcode, rlcode.kernels\n"
          "assert kernels.__file__ != rlcode.kernels.__file__\n"
          "assert hasattr(rlcode.kernels, 'AttentionSpec')\n"
          "print(transformers.__version__)")
  for cwd in (ROOT, os.path.dirname(ROOT)):
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=""))
    assert done.returncode == 0, (cwd, done.stderr[-2000:])
    assert int(done.stdout.split(".")[0]) >= 5, done.stdout
  cli = os.path.join(os.path.dirname(sys.executable), "rlcode")
  for cwd in (ROOT, "/"):
    done = subprocess.run([cli, "--help"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "train" in done.stdout, (cwd, done.stderr[-2000:])
