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
  return _moved_and_sub(repo, shas, names + ("loop.py", "kill.py", "esc.py", "dep.py"))


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
