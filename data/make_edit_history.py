"""Builds a git repository of small Python modules with tests, and a history of realistic edits.

    python data/make_edit_history.py DIR [--seed 0] [--commits 360] [--bundle PATH]
                                         [--made-up-nouns N]

The repository (DIR must not exist or be empty) holds one package:

    toolkit/__init__.py
    toolkit/<module>.py        constants and small functions (numbers, lists, strings)
    tests/test_<module>.py     the full tests: every case of every function
    checks/test_<module>.py    the weak tests: one assert per function

Tests are scripts of top-level asserts (`from toolkit.prices import cap_price`,
then `assert cap_price(150) == 100`); their expected values come from running
the package's correct code, so every commit's tests pass on that commit. Each
commit is one kind of edit, its message stating the change:
- add a module (with its tests and checks),
- fix a bug in one function: functions are sometimes added with a bug (an
  off-by-one, a lost edge case) that only some inputs reveal; the tests hold
  only the cases the bug does not affect until the fix, which adds the rest
  (a regression test), and the one check per function passes either way,
- rename a function across files (its module, the modules that call it, tests),
- add a parameter with a default that keeps old calls working, and its tests,
- change a module constant, and the tests' expected values with it,
- add a test case for a function.
Mined with MiningConfig(tests_hidden=("tests/test_*.py",),
tests_visible=("checks/test_*.py",), tests_support=("toolkit/*.py",)) each
task carries both test sets (rlcode.data.git.units). The same seed and commit
count give the same repository, commit ids included (fixed author and dates).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.abc
import importlib.util
import os
import random
import subprocess
import sys
from collections.abc import Callable

PACKAGE = "toolkit"
T0 = 1_704_067_200  # 2024-01-01, the first commit's time; one hour between commits
NOUNS = (("price", "prices"), ("score", "scores"), ("weight", "weights"), ("title", "titles"),
         ("rating", "ratings"), ("size", "sizes"), ("label", "labels"), ("grade", "grades"),
         ("speed", "speeds"), ("tag", "tags"), ("level", "levels"), ("note", "notes"),
         ("rank", "ranks"), ("code", "codes"), ("count", "counts"), ("vote", "votes"),
         ("step", "steps"), ("name", "names"), ("order", "orders"), ("event", "events"),
         ("row", "rows"), ("cell", "cells"), ("item", "items"), ("path", "paths"))


# ---------------------------------------------------------------------------
# Function templates: a body, the inputs to test it on, maybe a bug and a parameter to add.

def _ints(rng: random.Random) -> list[tuple]:
  return [(x,) for x in sorted(set(rng.sample(range(-30, 121), 6) + [0]))]


def _lists(rng: random.Random) -> list[tuple]:
  lists = [[rng.randint(-5, 12) for _ in range(rng.randint(1, 7))] for _ in range(4)]
  return [([],)] + [(xs,) for xs in lists] + [([3, 1, 3, 2, 1],)]


_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "zeta", "theta")


def _strings(rng: random.Random) -> list[tuple]:
  texts = [(" " * rng.randint(1, 3)).join(rng.sample(_WORDS, rng.randint(1, 4)))
           for _ in range(3)]
  return [("",), ("short",), ("two  spaces here",)] + [(t,) for t in texts]


@dataclasses.dataclass(frozen=True)
class Extension:
  """A parameter to add: the new parameters and body, what the message says, new cases."""

  params: str
  body: str
  says: str
  cases: Callable[[random.Random], list[tuple]]


@dataclasses.dataclass(frozen=True)
class Template:
  """A function family. {K} is the module constant it reads, {dep} a function it calls."""

  verbs: tuple[str, ...]
  kind: str  # "num" (int -> int, callable by composites), "list", "str", "composite"
  params: str
  body: str
  doc: str
  cases: Callable[[random.Random], list[tuple]]
  role: str = ""  # the constant's name is NOUN_ROLE; "" for none
  values: tuple = ()
  bug: tuple[str, str] | None = None  # (buggy body, what was wrong)
  extension: Extension | None = None


TEMPLATES = (
    Template(("cap", "limit", "clip"), "num", "x", "return min(x, {K})",
             "x, at most {K}.", _ints, "LIMIT", (10, 20, 50, 100),
             bug=("return x if x < {K} else {K} - 1",
                  "values at or above the limit came back one below it")),
    Template(("shift", "offset", "bump"), "num", "x", "return x + {K}",
             "x moved up by {K}.", _ints, "OFFSET", (1, 2, 3, 5, 7),
             extension=Extension("x, times=1", "return x + {K} * times",
                                 "`times`: how many steps of {K} to move",
                                 lambda rng: [(rng.randint(-10, 50), t) for t in (0, 2, 3)])),
    Template(("floor", "snap", "round_down"), "num", "x", "return x - x % {K}",
             "x rounded down to a multiple of {K}.", _ints, "STEP", (2, 5, 10),
             bug=("return x - abs(x) % {K}",
                  "negative values were rounded past the multiple below them")),
    Template(("sign", "direction"), "num", "x", "return (x > 0) - (x < 0)",
             "-1, 0 or 1: the sign of x.", _ints,
             bug=("return 1 if x >= 0 else -1", "zero had sign 1 instead of 0")),
    Template(("total", "sum_all"), "list", "xs", "return sum(xs)",
             "The sum of xs.", _lists,
             extension=Extension("xs, start=0", "return sum(xs, start)",
                                 "`start`: the value the sum begins from",
                                 lambda rng: [([1, 2], 10), ([], rng.randint(1, 9))])),
    Template(("mean", "average"), "list", "xs", "return sum(xs) / len(xs) if xs else 0.0",
             "The mean of xs; 0.0 for an empty list.", _lists,
             bug=("return sum(xs) / len(xs)",
                  "an empty list raised ZeroDivisionError instead of giving 0.0"),
             extension=Extension("xs, default=0.0",
                                 "return sum(xs) / len(xs) if xs else default",
                                 "`default`: the mean of an empty list",
                                 lambda rng: [([], -1.0), ([4, 6], 9.0)])),
    Template(("count_above", "count_over"), "list", "xs", "return sum(1 for x in xs if x > {K})",
             "How many items of xs exceed {K}.", _lists, "THRESHOLD", (0, 3, 5),
             bug=("return sum(1 for x in xs if x >= {K})",
                  "items equal to the threshold were counted"),
             extension=Extension(
                 "xs, inclusive=False",
                 "return sum(1 for x in xs if x > {K} or (inclusive and x == {K}))",
                 "`inclusive`: also count the items equal to {K}",
                 lambda rng: [([0, 3, 5, 7], True), ([5, 5, 1], True)])),
    Template(("largest", "top"), "list", "xs", "return max(xs, default=None)",
             "The largest item of xs, or None.", _lists,
             bug=("return max(xs) if xs else 0", "an empty list gave 0 instead of None")),
    Template(("head", "first"), "list", "xs", "return xs[:{K}]",
             "The first {K} items of xs.", _lists, "COUNT", (2, 3, 5),
             extension=Extension("xs, n={K}", "return xs[:n]",
                                 "`n`: how many items to keep (default {K})",
                                 lambda rng: [([4, 5, 6, 7], 1), ([1, 2], 0)])),
    Template(("dedupe", "unique"), "list", "xs",
             "seen = set()\nout = []\nfor x in xs:\n  if x not in seen:\n    seen.add(x)\n"
             "    out.append(x)\nreturn out",
             "The items of xs without repeats, in first-seen order.", _lists,
             bug=("return sorted(set(xs))", "the first-seen order of the items was lost")),
    Template(("chunk", "batch"), "list", "xs",
             "return [xs[i:i + {K}] for i in range(0, len(xs), {K})]",
             "xs in consecutive pieces of {K}.", _lists, "SIZE", (2, 3, 4),
             bug=("return [xs[i:i + {K}] for i in range(0, len(xs) - {K} + 1, {K})]",
                  "a last, shorter piece was dropped")),
    Template(("truncate", "shorten"), "str", "s",
             'return s if len(s) <= {K} else s[:{K} - 3] + "..."',
             "s cut to at most {K} characters, ending in ... when cut.", _strings, "WIDTH",
             (8, 10, 12),
             bug=('return s if len(s) <= {K} else s[:{K}] + "..."',
                  "long strings came back 3 characters longer than the width"),
             extension=Extension(
                 's, ellipsis="..."',
                 "return s if len(s) <= {K} else s[:{K} - len(ellipsis)] + ellipsis",
                 "`ellipsis`: the text that marks the cut",
                 lambda rng: [("a rather long sentence", "~"), ("tiny", "!")])),
    Template(("slug", "slugify"), "str", "s", 'return "-".join(s.lower().split())',
             "s in lower case, words joined by dashes.", _strings,
             bug=('return s.lower().replace(" ", "-")', "runs of spaces became several dashes"),
             extension=Extension('s, sep="-"', "return sep.join(s.lower().split())",
                                 "`sep`: what joins the words",
                                 lambda rng: [("Two Words", "_"), ("a  b c", ".")])),
    Template(("initials", "abbreviate"), "str", "s",
             'return "".join(w[0].upper() for w in s.split())',
             "The first letter of each word of s, upper case.", _strings),
    Template(("count_words", "word_count"), "str", "s", "return len(s.split())",
             "The number of words in s.", _strings,
             bug=('return len(s.split(" ")) if s else 0',
                  "repeated spaces were counted as extra words")),
    Template(("pad", "align"), "str", "s", 'return s.rjust({K}, ".")',
             "s right-aligned in {K} characters, padded with dots.", _strings, "WIDTH",
             (6, 8, 10)),
    Template(("apply", "map"), "composite", "xs", "return [{dep}(x) for x in xs]",
             "{dep} of every item of xs.", _lists),
    Template(("total_of", "sum_of"), "composite", "xs", "return sum({dep}(x) for x in xs)",
             "The sum of {dep} over xs.", _lists),
)


# ---------------------------------------------------------------------------
# The package's state, and its files.

@dataclasses.dataclass
class Function:
  template: Template
  verb: str
  noun: str
  module: str
  constant: str = ""  # the module constant it reads
  dep: Function | None = None
  bug: bool = False
  extended: bool = False
  cases: list = dataclasses.field(default_factory=list)  # [(args, kwargs)]
  check: tuple = ()  # the case of the one visible check: one the bug, if any, passes

  @property
  def name(self) -> str:
    return f"{self.verb}_{self.noun}"

  def source(self, correct: bool) -> str:
    t = self.template
    params, body = t.params, t.body
    if self.extended:
      params, body = t.extension.params, t.extension.body
    elif self.bug and not correct:
      body = t.bug[0]
    fill = {"K": self.constant, "dep": self.dep.name if self.dep else ""}
    doc = t.doc.format(**fill)
    lines = [f"def {self.name}({params.format(**fill)}):", f'  """{doc}"""']
    lines += ["  " + line for line in body.format(**fill).split("\n")]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Module:
  name: str
  noun: str
  constants: dict[str, object]
  functions: list[Function]

  @property
  def path(self) -> str:
    return f"{PACKAGE}/{self.name}.py"

  def source(self, correct: bool) -> str:
    deps = sorted({(f.dep.module, f.dep.name) for f in self.functions if f.dep})
    head = f'"""Helpers for {self.name}."""\n'
    if deps:
      head += "\n" + "".join(f"from {PACKAGE}.{m} import {name}\n" for m, name in deps)
    blocks = [head]
    if self.constants:
      blocks.append("".join(f"{k} = {v!r}\n" for k, v in self.constants.items()))
    blocks += [f.source(correct) for f in self.functions]
    return "\n\n".join(b.rstrip("\n") + "\n" for b in blocks)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Imports the package from rendered sources, never from disk."""

  def __init__(self, files: dict[str, str]):
    self.files = files

  def find_spec(self, name, path=None, target=None):
    base = name.replace(".", "/")
    for file, package in ((base + "/__init__.py", True), (base + ".py", False)):
      if file in self.files:
        return importlib.util.spec_from_loader(name, self, origin=file, is_package=package)
    return None

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    exec(compile(self.files[module.__spec__.origin], module.__spec__.origin, "exec"),
         module.__dict__)


def _outcomes(files: dict[str, str], calls: list[tuple[str, str, tuple, dict]]) -> list:
  """("ok", value) or ("raises", type name) of each (module, function, args, kwargs)."""
  finder = _Finder(files)
  sys.meta_path.insert(0, finder)
  try:
    out = []
    for module, name, args, kwargs in calls:
      fn = getattr(importlib.import_module(f"{PACKAGE}.{module}"), name)
      try:
        out.append(("ok", fn(*args, **kwargs)))
      except Exception as e:  # pylint: disable=broad-except
        out.append(("raises", type(e).__name__))
    return out
  finally:
    sys.meta_path.remove(finder)
    for key in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
      del sys.modules[key]


def _call(name: str, args: tuple, kwargs: dict) -> str:
  text = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
  return f"{name}({', '.join(text)})"


class Package:
  """Every module of the package; renders its sources and tests."""

  def __init__(self, nouns: tuple[tuple[str, str], ...] = NOUNS):
    self.modules: dict[str, Module] = {}
    self.nouns = nouns  # (noun, module name) pairs, taken in order by add_module

  def functions(self) -> list[Function]:
    return [f for m in self.modules.values() for f in m.functions]

  def sources(self, correct: bool) -> dict[str, str]:
    files = {f"{PACKAGE}/__init__.py": f'"""Small helpers, one module per kind of value."""\n'}
    files.update({m.path: m.source(correct) for m in self.modules.values()})
    return files

  def passing_cases(self) -> dict[int, list[tuple[tuple, dict, object]]]:
    """id(function) -> [(args, kwargs, expected)] the current code passes, in case order."""
    calls = [(f.module, f.name, args, kwargs) for f in self.functions()
             for args, kwargs in f.cases]
    correct = _outcomes(self.sources(True), calls)
    current = _outcomes(self.sources(False), calls)
    out: dict[int, list] = {id(f): [] for f in self.functions()}
    k = 0
    for f in self.functions():
      for args, kwargs in f.cases:
        if correct[k][0] == "ok" and current[k] == correct[k]:
          out[id(f)].append((args, kwargs, correct[k][1]))
        k += 1
    return out

  def files(self) -> dict[str, str]:
    files = self.sources(False)
    cases = self.passing_cases()
    for m in self.modules.values():
      names = ", ".join(f.name for f in m.functions)
      header = f"from {PACKAGE}.{m.name} import {names}\n\n"
      full = [f"assert {_call(f.name, a, kw)} == {want!r}\n"
              for f in m.functions for a, kw, want in cases[id(f)]]
      one = [f"assert {_call(f.name, a, kw)} == {want!r}\n"
             for f in m.functions for a, kw, want in cases[id(f)] if (a, kw) == f.check]
      files[f"tests/test_{m.name}.py"] = (f'"""Tests of {m.path}."""\n\n' + header
                                          + "".join(full))
      files[f"checks/test_{m.name}.py"] = (f'"""Quick checks of {m.path}: one per function."""'
                                           "\n\n" + header + "".join(one))
    return files


# ---------------------------------------------------------------------------
# The kinds of edit. Each changes the package and returns the commit message, or
# returns None when it does not apply now.

def made_up_nouns(n: int, seed: int) -> tuple[tuple[str, str], ...]:
  """`n` distinct pronounceable made-up nouns (and plurals), for histories whose names
  cannot be learnt by heart: a policy trained on them has to copy names from its prompt."""
  rng = random.Random(f"nouns-{seed}")
  real = {noun for noun, _ in NOUNS}
  nouns: dict[str, None] = {}  # insertion-ordered, so the same seed gives the same order
  while len(nouns) < n:
    word = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou")
                   for _ in range(rng.randint(2, 3))) + rng.choice(("", "n", "r", "l"))
    if word not in real:
      nouns[word] = None
  return tuple((w, w + "s") for w in nouns)


def add_module(pkg: Package, rng: random.Random) -> str | None:
  free = [(noun, name) for noun, name in pkg.nouns if name not in pkg.modules]
  if not free:
    return None
  noun, name = free[0]
  nums = [f for f in pkg.functions() if f.template.kind == "num"]
  pool = [t for t in TEMPLATES if t.kind != "composite" or nums]
  module = Module(name, noun, {}, [])
  for t in rng.sample(pool, rng.randint(3, 5)):
    f = Function(t, t.verbs[0], noun, name, bug=t.bug is not None and rng.random() < 0.6)
    if t.role:
      f.constant = f"{noun.upper()}_{t.role}"
      while f.constant in module.constants:
        f.constant += "_2"
      module.constants[f.constant] = rng.choice(t.values)
    if t.kind == "composite":
      f.dep = rng.choice(nums)
    f.cases = [(args, {}) for args in t.cases(rng)]
    module.functions.append(f)
  # The one check per function is a case the bug, if any, passes, so the checks
  # pass before the fix too; a bug no case survives is not planted.
  pkg.modules[name] = module
  cases = pkg.passing_cases()
  for f in module.functions:
    f.bug = f.bug and bool(cases[id(f)])
    f.check = cases[id(f)][0][:2] if cases[id(f)] else f.cases[0]
  names = ", ".join(f.name for f in module.functions)
  return f"Add {module.path} with {names}, and their tests"


def fix_bug(pkg: Package, rng: random.Random) -> str | None:
  buggy = [f for f in pkg.functions() if f.bug]
  if not buggy:
    return None
  f = rng.choice(buggy)
  f.bug = False
  return (f"Fix {f.name} in {PACKAGE}/{f.module}.py: {f.template.bug[1]}; "
          "add the cases that show it to the tests")


def rename(pkg: Package, rng: random.Random) -> str | None:
  called = {id(f.dep) for f in pkg.functions() if f.dep}
  candidates = [f for f in pkg.functions() if len(f.template.verbs) > 1]
  if not candidates:
    return None
  with_callers = [f for f in candidates if id(f) in called]
  f = rng.choice(with_callers if with_callers and rng.random() < 0.6 else candidates)
  old = f.name
  f.verb = rng.choice([v for v in f.template.verbs if v != f.verb])
  callers = sorted({g.module for g in pkg.functions() if g.dep is f})
  where = f"{PACKAGE}/{f.module}.py"
  if callers:
    where += " and its callers in " + ", ".join(f"{PACKAGE}/{m}.py" for m in callers)
  return f"Rename {old} to {f.name} in {where}"


def add_parameter(pkg: Package, rng: random.Random) -> str | None:
  candidates = [f for f in pkg.functions()
                if f.template.extension and not f.extended and not f.bug]
  if not candidates:
    return None
  f = rng.choice(candidates)
  ext = f.template.extension
  f.extended = True
  names = [p.split("=")[0].strip() for p in ext.params.split(",")][1:]
  for args in ext.cases(rng):
    f.cases.append((args[:1], dict(zip(names, args[1:]))))
  says = ext.says.format(K=f.constant)
  return f"Add a parameter to {f.name} in {PACKAGE}/{f.module}.py: {says}; old calls are unchanged"


def change_constant(pkg: Package, rng: random.Random) -> str | None:
  candidates = [f for f in pkg.functions() if f.constant and not f.bug]
  if not candidates:
    return None
  f = rng.choice(candidates)
  module = pkg.modules[f.module]
  old = module.constants[f.constant]
  module.constants[f.constant] = rng.choice([v for v in f.template.values if v != old])
  return (f"Change {f.constant} in {module.path} from {old!r} to "
          f"{module.constants[f.constant]!r}, and the tests' expected values with it")


def new_test(pkg: Package, rng: random.Random) -> str | None:
  candidates = [f for f in pkg.functions() if not f.bug]
  if not candidates:
    return None
  f = rng.choice(candidates)
  known = {repr(c) for c in f.cases}
  fresh = [(args, {}) for args in f.template.cases(rng) if repr((args, {})) not in known]
  if not fresh:
    return None
  f.cases.append(fresh[0])
  return f"Test {_call(f.name, *fresh[0])} in tests/test_{f.module}.py"


EDITS = ((add_module, 0.10), (fix_bug, 0.22), (rename, 0.14), (add_parameter, 0.12),
         (change_constant, 0.22), (new_test, 0.20))


# ---------------------------------------------------------------------------
# The repository.

class Repository:
  """A git repository whose working tree is the package's files."""

  def __init__(self, path: str):
    if os.path.exists(path) and os.listdir(path):
      raise SystemExit(f"make_edit_history: {path} exists and is not empty")
    os.makedirs(path, exist_ok=True)
    self.path, self.commits = path, 0
    self.git("init", "-q", "-b", "main")

  def git(self, *args: str) -> str:
    stamp = f"@{T0 + 3600 * self.commits} +0000"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="Edit History", GIT_AUTHOR_EMAIL="history@example.com",
               GIT_COMMITTER_NAME="Edit History", GIT_COMMITTER_EMAIL="history@example.com",
               GIT_AUTHOR_DATE=stamp, GIT_COMMITTER_DATE=stamp,
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", *args], cwd=self.path, env=env, capture_output=True,
                          check=True, text=True).stdout.strip()

  def commit(self, files: dict[str, str], message: str) -> None:
    for path, text in files.items():
      full = os.path.join(self.path, path)
      os.makedirs(os.path.dirname(full), exist_ok=True)
      with open(full, "w") as f:
        f.write(text)
    self.git("add", "-A")
    if not self.git("status", "--porcelain"):
      raise RuntimeError(f"the edit {message!r} changed no file")
    self.commits += 1
    self.git("commit", "-q", "-m", message)


def build(path: str, seed: int, commits: int, made_up: int = 0) -> str:
  """Makes the repository at `path`; returns its head commit. `made_up` > 0: the
  modules are named by that many made-up nouns (`made_up_nouns`) instead of NOUNS."""
  rng = random.Random(seed)
  pkg = Package(made_up_nouns(made_up, seed) if made_up else NOUNS)
  repo = Repository(path)
  while repo.commits < commits:
    if len(pkg.modules) < 3:
      message = add_module(pkg, rng)
    else:
      kinds, weights = zip(*EDITS)
      message = rng.choices(kinds, weights)[0](pkg, rng)
    if message is not None:
      repo.commit(pkg.files(), message)
  return repo.git("rev-parse", "HEAD")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("dir", help="where to make the repository (absent or empty)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--commits", type=int, default=360)
  parser.add_argument("--made-up-nouns", type=int, default=0, metavar="N",
                      help="name the modules by N made-up nouns instead of the 24 real ones "
                           "(practice histories whose names must be copied, not recalled)")
  parser.add_argument("--bundle", default="", help="also write the history as a git bundle")
  args = parser.parse_args(argv)
  head = build(args.dir, args.seed, args.commits, args.made_up_nouns)
  if args.bundle:
    subprocess.run(["git", "-C", args.dir, "bundle", "create", "-q",
                    os.path.abspath(args.bundle), "HEAD", "main"], check=True)
  print(f"{args.dir}: {args.commits} commits, head {head}")


if __name__ == "__main__":
  main()
