"""A small history made at test time for the executable-PR-task tests: a pure-Python
package, its pytest tests, and PRs of every kind the miner must sort.

`make_history(path)` returns the repository and a dict naming each PR's commit:
  mul       adds calc.mul and its test (one FAIL_TO_PASS, test_add PASS_TO_PASS)
  two       fixes calc.ops.neg and calc.fmt.show, each with its test (two files: each
            part checked by its own test; fmt.py's docstring also changes, a hunk no test
            sees), merged from a branch of two commits
  code      a code change with no test change (no_test_change)
  tests     a test change with no code change (no_code_change)
  hang      a code change whose new test never ends (timeout)
  kill      a code change whose test module kills its interpreter (crash)
  escape    a code change whose new test writes outside the sandbox (fails there: the
            PR has no FAIL_TO_PASS test; the host file is never written)
  missing   a code change whose test imports a module nobody has (missing_dependency)
  six       a code change alone (no_test_change): setup.py requires six, calc/compat.py
            imports it
  drop      drops six from setup.py and compat.py and adds compat.join, with a unittest
            module (test_join checks two cases with subTest): test_text passes before it
            too, since the base declares six (PASS_TO_PASS; test_join the FAIL_TO_PASS)
  flaky     adds calc/half.py; its test fails under every odd PYTHONHASHSEED, as a test
            that depends on a set's order would (flaky: the gold's second run has seed 1)
  sub       adds calc.sub, its test in the same file as test_add, the package in src/
            (a src layout from this PR on)
"""

from __future__ import annotations

from pathlib import Path

from git_repos import Repo

PYPROJECT = """[project]
name = "calc"
version = "0"

[project.optional-dependencies]
tests = ["pytest"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

SETUP = "from setuptools import setup\n\nsetup(name='calc', install_requires=[{requires}])\n"

COMPAT_TEST = """import unittest

from calc import compat


class CompatTests(unittest.TestCase):
  def test_text(self):
    self.assertEqual(compat.text(1), "1")

  def test_join(self):
    for xs, want in [([1, 2], "1,2"), ([], "")]:
      with self.subTest(xs=xs):
        self.assertEqual(compat.join(xs), want)
"""

FMT = ('"""Formatting."""\n\n' + "".join(f"# note {i}\n" for i in range(8))
       + "\n\ndef show(x):\n  return str(x)\n")


def make_history(path: Path, escape_target: Path | None = None,
                 hostile: bool = True) -> tuple[Repo, dict[str, str]]:
  """The history of the module docstring; hostile=False leaves out the PRs whose tests
  hang, kill, escape or miss a dependency (and their modules)."""
  repo = Repo(path)
  shas = {}
  repo.commit("Start calc", {
      "pyproject.toml": PYPROJECT,
      "calc/__init__.py": "from calc.ops import add, neg\n",
      "calc/ops.py": "def add(a, b):\n  return a + b\n\n\ndef neg(x):\n  return x\n",
      "calc/fmt.py": FMT,
      "tests/__init__.py": "",
      "tests/test_ops.py": "import calc\n\n\ndef test_add():\n  assert calc.add(2, 3) == 5\n",
      "README.md": "calc\n"})
  shas["mul"] = repo.commit("Add mul\n\nMultiplies two numbers.", {
      "calc/ops.py": repo.show("HEAD", "calc/ops.py") + "\n\ndef mul(a, b):\n  return a * b\n",
      "calc/__init__.py": "from calc.ops import add, mul, neg\n",
      "tests/test_ops.py": repo.show("HEAD", "tests/test_ops.py")
                           + "\n\ndef test_mul():\n  assert calc.mul(2, 3) == 6\n"})
  repo.git("checkout", "-q", "-b", "fix")
  repo.commit("Fix neg", {
      "calc/ops.py": repo.show("HEAD", "calc/ops.py").replace("  return x\n", "  return -x\n", 1),
      "tests/test_ops.py": repo.show("HEAD", "tests/test_ops.py")
                           + "\n\ndef test_neg():\n  assert calc.neg(4) == -4\n"})
  repo.commit("Fix show", {
      "calc/fmt.py": FMT.replace('"""Formatting."""', '"""Formatting numbers."""').replace(
          "return str(x)", "return f'<{x}>'"),
      "tests/test_fmt.py": "from calc.fmt import show\n\n\ndef test_show():\n"
                           "  assert show(1) == '<1>'\n"})
  repo.git("checkout", "-q", "main")
  repo.time += 100
  repo.git("merge", "-q", "--no-ff", "fix", "-m",
           "Merge pull request #2 from t/fix\n\nFix neg and show")
  shas["two"] = repo.git("rev-parse", "HEAD")
  shas["code"] = repo.commit("Document add", {
      "calc/ops.py": "# Arithmetic.\n" + repo.show("HEAD", "calc/ops.py")})
  shas["tests"] = repo.commit("More add tests", {
      "tests/test_ops.py": repo.show("HEAD", "tests/test_ops.py")
                           + "\n\ndef test_add_zero():\n  assert calc.add(0, 0) == 0\n"})
  names = ("__init__.py", "ops.py", "fmt.py")
  if not hostile:
    return _moved_and_sub(repo, shas, names)
  shas["hang"] = repo.commit("Add loop", {
      "calc/loop.py": "def spin():\n  return 1\n",
      "tests/test_loop.py": "from calc import loop\n\n\ndef test_spin():\n"
                            "  while True:\n    pass\n"})
  shas["kill"] = repo.commit("Add kill", {
      "calc/kill.py": "X = 1\n",
      "tests/test_kill.py": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n\n\n"
                            "def test_x():\n  from calc import kill\n  assert kill.X == 1\n"})
  target = escape_target or (path.parent / "escaped.txt")
  shas["escape"] = repo.commit("Add escape", {
      "calc/esc.py": "Y = 2\n",
      "tests/test_esc.py": "def test_write_outside():\n"
                           f"  with open({str(target)!r}, 'w') as f:\n    f.write('out')\n"
                           "  from calc import esc\n  assert esc.Y == 2\n"})
  shas["missing"] = repo.commit("Add dep", {
      "calc/dep.py": "Z = 3\n",
      "tests/test_dep.py": "import nonexistent_rlcode_dependency\n\n\ndef test_z():\n"
                           "  from calc import dep\n  assert dep.Z == 3\n"})
  repo.commit("Use six", {
      "setup.py": SETUP.format(requires='"six"'),
      "calc/compat.py": "import six\n\n\ndef text(x):\n  return six.text_type(x)\n"})
  shas["drop"] = repo.commit("Drop six\n\nAlso joins texts.", {
      "setup.py": SETUP.format(requires=""),
      "calc/compat.py": "def text(x):\n  return str(x)\n\n\ndef join(xs):\n"
                        "  return ','.join(text(x) for x in xs)\n",
      "tests/test_compat.py": COMPAT_TEST})
  shas["flaky"] = repo.commit("Add half", {
      "calc/half.py": "def half(x):\n  return x / 2\n",
      "tests/test_half.py": "import os\n\nfrom calc import half\n\n\ndef test_half():\n"
                            "  assert half.half(4) == 2\n"
                            "  assert int(os.environ['PYTHONHASHSEED']) % 2 == 0\n"})
  return _moved_and_sub(repo, shas, names + ("loop.py", "kill.py", "esc.py", "dep.py",
                                             "compat.py", "half.py"))


def _moved_and_sub(repo: Repo, shas: dict[str, str], names) -> tuple[Repo, dict[str, str]]:
  moved = {f"src/calc/{name}": repo.show("HEAD", f"calc/{name}") for name in names}
  repo.git("rm", "-q", "-r", "calc")
  repo.commit("Move to src", moved)
  shas["sub"] = repo.commit("Add sub", {
      "src/calc/ops.py": repo.show("HEAD", "src/calc/ops.py")
                         + "\n\ndef sub(a, b):\n  return a - b\n",
      "tests/test_ops.py": repo.show("HEAD", "tests/test_ops.py")
                           + "\n\ndef test_sub():\n  assert calc.ops.sub(3, 1) == 2\n"})
  return repo, shas


def make_untested(path: Path) -> Repo:
  """A repository with code and no tests at all."""
  repo = Repo(path)
  repo.commit("Start", {"lib/a.py": "A = 1\n"})
  repo.commit("Change", {"lib/a.py": "A = 2\n"})
  return repo


# Forges pytest's report of a test from the code under test: every report it makes passes.
FORGE_REPORTS = """
if "_pytest.reports" in sys.modules:
  from _pytest.reports import TestReport
  made = TestReport.from_item_and_call.__func__

  def forged(cls, item, call):
    report = made(cls, item, call)
    report.outcome, report.longrepr = "passed", None
    return report

  TestReport.from_item_and_call = classmethod(forged)
"""
WRONG_MUL = "def mul(a, b):\n  return a + b\n"
MUL_TEST = "from calc.{name} import mul\n\n\ndef test_mul():\n  assert mul(2, 3) == 6\n"
FIXTURE_TEST = ("import pytest\n\nfrom calc.{name} import mul\n\n\n@pytest.fixture\n"
                "def two():\n  return 2\n\n\ndef test_mul(two):\n  assert mul(two, 3) == 6\n")
# Each forged PR adds calc/NAME.py and tests/test_NAME.py (MUL_TEST unless given): a mul
# that adds, and its test, which fails before the PR (the module is missing) and fails
# after it too, unless the outcome is forged.
FORGED = {
    # The test wraps the report plugin's emitter: every test it reports passed.
    "emitter": (WRONG_MUL, {"tests/test_emitter.py": (
        "import sys\n\nfrom calc.emitter import mul\n\n"
        "plugin = sys.modules.get('rlcode_pytest_report')\n"
        "if plugin is not None:\n  real = plugin._emit\n\n"
        "  def _emit(record):\n    if record.get('e') == 'test':\n      record['o'] = 'passed'\n"
        "    real(record)\n\n  plugin._emit = _emit\n\n\n"
        "def test_mul():\n  assert mul(2, 3) == 6\n")}),
    # The code patches _pytest.reports.TestReport.
    "report_class": ("import sys\n\n\n" + WRONG_MUL + FORGE_REPORTS, None),
    # A conftest rewrites every report in a hook (its directory alone).
    "hook": (WRONG_MUL, {
        "tests/hook/__init__.py": "",
        "tests/hook/conftest.py": (
            "import pytest\n\n\n@pytest.hookimpl(wrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n  report = yield\n"
            "  report.outcome, report.longrepr = 'passed', None\n  return report\n"),
        "tests/hook/test_hook.py": MUL_TEST.format(name="hook")}),
    # The code ends the interpreter when it is imported, with status 0.
    "exit_import": ("import os\n\nos._exit(0)\n\n\n" + WRONG_MUL, None),
    # The code ends the interpreter, status 0, when the test calls it.
    "exit_call": ("import os\n\n\ndef mul(a, b):\n  os._exit(0)\n", None),
    # The code replaces the report plugin's outcome table with one where every test passed.
    "plugin_module": ("import sys\n\n\n" + WRONG_MUL + (
        "\n\nclass Passed(dict):\n  def pop(self, key, default=None):\n    return 'passed'\n\n\n"
        "plugin = sys.modules.get('rlcode_pytest_report')\n"
        "if plugin is not None:\n  plugin._outcomes = Passed()\n"), None),
    # The code writes the report file itself (the plugin's nonce read from its module), a
    # pass and a clean end, and ends the interpreter before pytest can write the failure.
    "fake_report": (
        "import json, os, sys\n\n\ndef mul(a, b):\n"
        "  plugin = sys.modules.get('rlcode_pytest_report')\n"
        "  if plugin is not None and plugin._PATH:\n"
        "    with open(plugin._PATH, 'a') as f:\n"
        "      for record in ({'e': 'test', 'id': 'tests/test_fake_report.py::test_mul',\n"
        "                      'o': 'passed'}, {'e': 'done', 'status': 0}):\n"
        "        f.write(json.dumps(dict(record, n=plugin._NONCE)) + '\\n')\n"
        "    os._exit(0)\n  return a + b\n", None),
    # The code replaces, in pytest's Function.setup, the function pytest calls with one
    # that returns (the test takes a fixture, so the second runner runs it in pytest).
    "setup_swap": ("import sys\n\n\n" + WRONG_MUL + (
        "\n\nif '_pytest.python' in sys.modules:\n  from _pytest.python import Function\n"
        "  real = Function.setup\n\n  def setup(self):\n    real(self)\n"
        "    self.obj = lambda *args, **kwargs: None\n\n  Function.setup = setup\n"),
        {"tests/test_setup_swap.py": FIXTURE_TEST.format(name="setup_swap")}),
    # A conftest's setup hook does the same (its directory alone).
    "hook_swap": (WRONG_MUL, {
        "tests/hook_swap/__init__.py": "",
        "tests/hook_swap/conftest.py": (
            "def pytest_runtest_setup(item):\n  item.obj = lambda *args, **kwargs: None\n"),
        "tests/hook_swap/test_hook_swap.py": MUL_TEST.format(name="hook_swap")}),
    # A conftest wraps the test in a functools.wraps wrapper that swallows its assertion:
    # unwrapping finds the test's own function, which is called and raises.
    "swallow": (WRONG_MUL, {
        "tests/swallow/__init__.py": "",
        "tests/swallow/conftest.py": (
            "import functools\n\nimport pytest\n\n\n@pytest.hookimpl(tryfirst=True)\n"
            "def pytest_runtest_setup(item):\n  real = item.obj\n\n  @functools.wraps(real)\n"
            "  def swallow(*args, **kwargs):\n    try:\n      real(*args, **kwargs)\n"
            "    except AssertionError:\n      pass\n\n  item.obj = swallow\n"),
        "tests/swallow/test_swallow.py": MUL_TEST.format(name="swallow")}),
    # A conftest runs the test twice and swallows the second run's failure, the code right
    # on its first call only: the test's code returned once, then raised. Hypothesis does
    # the same with a test that passes some examples (it replays the failing one last).
    "swallow_last": ("calls = []\n\n\ndef mul(a, b):\n  calls.append(1)\n"
                     "  return a * b if len(calls) == 1 else a + b\n", {
        "tests/swallow_last/__init__.py": "",
        "tests/swallow_last/conftest.py": (
            "import functools\n\nimport pytest\n\n\n@pytest.hookimpl(tryfirst=True)\n"
            "def pytest_runtest_setup(item):\n  real = item.obj\n\n  @functools.wraps(real)\n"
            "  def twice(*args, **kwargs):\n    real(*args, **kwargs)\n    try:\n"
            "      real(*args, **kwargs)\n    except AssertionError:\n      pass\n\n"
            "  item.obj = twice\n"),
        "tests/swallow_last/test_swallow_last.py": MUL_TEST.format(name="swallow_last")}),
}
# Forgeries the second runner does not stop (rlcode.swe.crosscheck's known limits).
KNOWN_LIMITS = {
    # Correct where pytest is not imported (the second runner's direct route), wrong and
    # forged (TestReport) where it is.
    "detects": ("import sys\n\n\ndef mul(a, b):\n  return a * b if '_pytest' not in sys.modules"
                " else a + b\n" + FORGE_REPORTS, None),
    # Reads the second runner's key pipe during the call and writes the verdict itself.
    "key_pipe": ("import os, sys\n\n\ndef mul(a, b):\n"
                 "  if '_pytest' not in sys.modules and len(sys.argv) == 6:\n"
                 "    os.write(int(sys.argv[2]), os.read(int(sys.argv[3]), 64) + b' returned\\n')\n"
                 "    os._exit(0)\n  return a + b\n" + FORGE_REPORTS, None),
    # An answer equal to everything: the test's assertion cannot see it is wrong.
    "lying_eq": ("class Anything:\n  def __eq__(self, other):\n    return True\n\n\n"
                 "def mul(a, b):\n  return Anything()\n", None),
}
HONEST_TEST = ("import pytest\n\nfrom calc.honest import mul\n\n\n@pytest.fixture\ndef three():\n"
               "  return 3\n\n\ndef test_mul():\n  assert mul(2, 3) == 6\n\n\n"
               "def test_mul_fixture(three):\n  assert mul(2, three) == 6\n")


# A test that leaves a process behind: it forks every round (a new pid each time, which
# one scan of /proc can miss) and for 8 s at most, 5000 rounds, rewrites the victim's test
# to pass; run before the victim, it must not change the victim's verdict.
SURVIVOR = {
    "tests/test_survivor.py": (
        "import os\nimport time\n\n\ndef test_spawn():\n  victim = os.path.join(os.getcwd(), "
        "'tests', 'test_survivor_victim.py')\n  if os.fork() == 0:\n    os.setsid()\n"
        "    end = time.monotonic() + 8\n    for _ in range(5000):\n"
        "      if time.monotonic() > end or os.fork():\n        os._exit(0)\n      try:\n"
        "        with open(victim, 'w') as f:\n          f.write('def test_mul():\\n  pass\\n')\n"
        "      except OSError:\n        pass\n      time.sleep(0.002)\n    os._exit(0)\n"),
    "tests/test_survivor_victim.py": "def test_mul():\n  assert 2 + 3 == 6\n",
}


def forged_base() -> dict[str, str]:
  """The forged history's first commit."""
  return {"pyproject.toml": PYPROJECT, "calc/__init__.py": "",
          "calc/ops.py": "def add(a, b):\n  return a + b\n", "tests/__init__.py": "",
          "tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n"
                               "  assert add(2, 3) == 5\n"}


def forged_pr(name: str) -> dict[str, str]:
  """The files the PR `name` adds: "honest" (a right mul, one test the second runner calls
  itself and one with a fixture, which it runs in pytest), or one of FORGED and
  KNOWN_LIMITS."""
  if name == "honest":
    return {"calc/honest.py": "def mul(a, b):\n  return a * b\n", "tests/test_honest.py": HONEST_TEST}
  code, tests = {**FORGED, **KNOWN_LIMITS}[name]
  return {f"calc/{name}.py": code, **(tests or {f"tests/test_{name}.py": MUL_TEST.format(name=name)})}


def make_forged(path: Path, names) -> tuple[Repo, dict[str, str]]:
  """A history of forged_base and then one PR per name (forged_pr), and their commits."""
  repo = Repo(path)
  repo.commit("Start calc", forged_base())
  return repo, {name: repo.commit(f"Add mul ({name})", forged_pr(name)) for name in names}
