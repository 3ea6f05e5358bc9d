"""What a repository declares its code and tests need, and how its code is imported, read
from its files (never run).

`declared_deps(files)` collects distribution names from the places Python projects
declare what they require to run (the package's own requirements: its tests import it)
and what their tests require:
- pyproject.toml: [project] dependencies; [project.optional-dependencies] and
  [dependency-groups] entries whose name holds "test" or is "dev" (tests, testing,
  tests-no-zope; groups' include-group followed);
- setup.cfg: [options] install_requires and tests_require; [options.extras_require] the
  test names;
- setup.py (parsed, never run): the strings of the list literals of the install_requires
  and tests_require arguments, and in the value of a dict entry or an item assignment
  whose key is a test name (`"tests_no_zope": [...]`, and "zope.interface" of
  `EXTRAS["tests"] = EXTRAS["tests_no_zope"] + ["zope.interface"]`);
- the root's requirements.txt, and requirements files whose name says test or dev
  (requirements-test.txt, dev-requirements.txt, requirements/tests.txt, ...), with their
  -r includes;
- tox.ini: the deps of [testenv].
Markers are kept out of the names (rlcode.swe.testenv evaluates requirements itself);
a line that does not parse is skipped.

`declared_version(files)`: the version the tree declares, read the same way.

`python_path(files)`: the workspace directories that make the repository importable
from its checkout: "src" first when a package lives under src/ (a src layout), then the
root.

This module must not touch the host environment nor run anything.
"""

from __future__ import annotations

import ast
import configparser
import posixpath
import re
import tomllib
from collections.abc import Iterable, Mapping

from packaging.requirements import InvalidRequirement, Requirement

from rlcode import pyast

_REQUIREMENTS = re.compile(r"(^|/)(requirements[-_/.]?)?[^/]*(test|dev)[^/]*\.txt$")
_SETUP_KEYWORDS = ("install_requires", "tests_require")


def is_test_extra(name: str) -> bool:
  """Whether an extra or dependency group of this name holds test requirements."""
  return "test" in name.lower() or name.lower() == "dev"


def _names(lines: Iterable[str]) -> list[str]:
  out = []
  for line in lines:
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith(("-", ".", "/")) or "://" in line:
      continue
    try:
      out.append(Requirement(line).name)
    except InvalidRequirement:
      continue
  return out


def _pyproject(text: str) -> list[str]:
  try:
    data = tomllib.loads(text)
  except (tomllib.TOMLDecodeError, ValueError):
    return []
  out = []
  project = data.get("project", {})
  if isinstance(project, dict) and isinstance(project.get("dependencies"), list):
    out += _names(e for e in project["dependencies"] if isinstance(e, str))
  extras = project.get("optional-dependencies", {}) if isinstance(project, dict) else {}
  if isinstance(extras, dict):
    for name, entries in extras.items():
      if is_test_extra(name) and isinstance(entries, list):
        out += _names(e for e in entries if isinstance(e, str))
  groups = data.get("dependency-groups", {})
  if isinstance(groups, dict):
    seen: set[str] = set()
    todo = [g for g in groups if is_test_extra(g)]
    while todo:
      group = todo.pop()
      if group in seen or not isinstance(groups.get(group), list):
        continue
      seen.add(group)
      for entry in groups[group]:
        if isinstance(entry, str):
          out += _names([entry])
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
          todo.append(entry["include-group"])
  return out


def _setup_py(text: str) -> list[str]:
  try:
    tree = pyast.parse(text)
  except (SyntaxError, ValueError, RecursionError):
    return []
  values: list[ast.AST] = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Dict):
      values += [v for k, v in zip(node.keys, node.values) if _extra_key(k)]
    elif isinstance(node, ast.Assign):
      values += [node.value for t in node.targets
                 if isinstance(t, ast.Subscript) and _extra_key(t.slice)]
    elif isinstance(node, ast.Call):
      values += [k.value for k in node.keywords if k.arg in _SETUP_KEYWORDS]
  return _names(e.value for v in values for n in ast.walk(v)
                if isinstance(n, (ast.List, ast.Tuple, ast.Set)) for e in n.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str))


def _extra_key(node) -> bool:
  return (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and is_test_extra(node.value))


def _setup_cfg(text: str) -> list[str]:
  parser = configparser.ConfigParser(interpolation=None)
  try:
    parser.read_string(text)
  except configparser.Error:
    return []
  out = [n for key in _SETUP_KEYWORDS if parser.has_option("options", key)
         for n in _names(parser.get("options", key).splitlines())]
  if parser.has_section("options.extras_require"):
    out += [n for name, value in parser.items("options.extras_require") if is_test_extra(name)
            for n in _names(value.splitlines())]
  return out


def _tox(text: str) -> list[str]:
  parser = configparser.ConfigParser(interpolation=None, strict=False)
  try:
    parser.read_string(text)
  except configparser.Error:
    return []
  if not parser.has_option("testenv", "deps"):
    return []
  return _names(re.sub(r"^\s*\w[\w,-]*:\s*", "", line)
                for line in parser.get("testenv", "deps").splitlines())


def _requirements(files: Mapping[str, str], path: str, seen: set[str]) -> list[str]:
  if path in seen or path not in files:
    return []
  seen.add(path)
  out = []
  for line in files[path].splitlines():
    line = line.strip()
    if line.startswith(("-r ", "--requirement ")):
      include = posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                  line.split(None, 1)[1].strip()))
      out += _requirements(files, include, seen)
  return out + _names(files[path].splitlines())


def declared_deps(files: Mapping[str, str]) -> tuple[str, ...]:
  """The distribution names a tree declares for its code and tests (module docstring),
  sorted."""
  names: list[str] = []
  if "pyproject.toml" in files:
    names += _pyproject(files["pyproject.toml"])
  if "setup.cfg" in files:
    names += _setup_cfg(files["setup.cfg"])
  if "setup.py" in files:
    names += _setup_py(files["setup.py"])
  if "tox.ini" in files:
    names += _tox(files["tox.ini"])
  seen: set[str] = set()
  for path in sorted(files):
    if path == "requirements.txt" or path.count("/") <= 1 and _REQUIREMENTS.search(path):
      names += _requirements(files, path, seen)
  return tuple(sorted({re.sub(r"[-_.]+", "-", n).lower() for n in names}))


_VERSION = re.compile(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"\s]+)['\"]", re.MULTILINE)


def declared_version(files: Mapping[str, str]) -> str:
  """The version a tree declares as a literal ("" when none): pyproject.toml's [project]
  version, setup.cfg's [metadata] version, setup.py's version= string, else a top-level
  package's or module's `__version__ = "..."` (SWE-bench's `version`)."""
  try:
    project = tomllib.loads(files.get("pyproject.toml", "")).get("project", {})
  except (tomllib.TOMLDecodeError, ValueError):
    project = {}
  if isinstance(project, dict) and isinstance(project.get("version"), str):
    return project["version"]
  parser = configparser.ConfigParser(interpolation=None)
  try:
    parser.read_string(files.get("setup.cfg", ""))
    version = parser.get("metadata", "version", fallback="")
  except configparser.Error:
    version = ""
  if version and not version.startswith(("attr:", "file:")):
    return version.strip()
  try:
    tree = pyast.parse(files.get("setup.py", ""))
  except (SyntaxError, ValueError, RecursionError):
    tree = None
  for node in ast.walk(tree) if tree is not None else ():
    if isinstance(node, ast.Call):
      for k in node.keywords:
        if k.arg == "version" and isinstance(k.value, ast.Constant) \
            and isinstance(k.value.value, str):
          return k.value.value
  names = top_level_names(files)
  for path in sorted(files):
    module = path.removeprefix("src/").removesuffix("/__init__.py").removesuffix(".py")
    if module in names and (path.endswith("/__init__.py") or "/" not in module):
      found = _VERSION.search(files[path])
      if found:
        return found.group(1)
  return ""


def python_path(files: Mapping[str, str]) -> tuple[str, ...]:
  """("src", ".") for a src layout (a package directly under src/), else (".",)."""
  src = any(p.startswith("src/") and p.count("/") == 2 and p.endswith("/__init__.py")
            for p in files)
  return ("src", ".") if src else (".",)


def top_level_names(files: Mapping[str, str]) -> frozenset[str]:
  """The module names the tree provides at the top of its import path (packages and
  modules at the root and, for a src layout, under src/)."""
  out = set()
  for path in files:
    for root in ("", "src/"):
      if not path.startswith(root):
        continue
      rest = path[len(root):].split("/")
      if len(rest) == 1 and rest[0].endswith(".py"):
        out.add(rest[0][:-3])
      elif len(rest) == 2 and rest[1] == "__init__.py":
        out.add(rest[0])
  return frozenset(out)
