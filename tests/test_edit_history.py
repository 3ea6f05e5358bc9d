"""data/make_edit_history.py: a deterministic, mineable history whose tasks carry two test sets.

A short history is built here and mined through rlcode.data.git like any
repository; the oracle answers are run against the tests in the sandbox
(rlcode.rewards.tests, through rlcode.sandbox), and so is doing nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rlcode import sandbox
from rlcode.data.git import MiningConfig, mine
from rlcode.rewards import registry
from rlcode.rewards.tests import files_job, split_file_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "data", "make_edit_history.py")
COMMITS = 40
TESTS = dict(tests_hidden=("tests/test_*.py",), tests_visible=("checks/test_*.py",),
             tests_support=("toolkit/*.py",))


def _make(path, commits: int, seed: int = 3) -> str:
  r = subprocess.run([sys.executable, SCRIPT, str(path), "--seed", str(seed),
                      "--commits", str(commits)], capture_output=True, text=True, check=True)
  return r.stdout.split("head ")[-1].strip()


def _git(path, *args: str) -> str:
  return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True,
                        check=True).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
  path = tmp_path_factory.mktemp("history") / "repo"
  head = _make(path, COMMITS)
  return path, head


@pytest.fixture(scope="module")
def mined(history):
  path, _ = history
  return mine(MiningConfig(source=str(path), test_fraction=0.25, **TESTS),
              granularities=("pr", "file", "hunk"))


def test_the_history_is_deterministic_and_each_message_states_an_edit(history, tmp_path):
  path, head = history
  # The same seed walks the same way: a shorter history is a prefix of it.
  assert _make(tmp_path / "short", 12) == _git(path, "rev-parse", f"HEAD~{COMMITS - 12}")
  assert _git(path, "rev-list", "--count", "HEAD") == str(COMMITS)
  messages = _git(path, "log", "--format=%s").splitlines()
  kinds = {m.split()[0] for m in messages}
  assert kinds == {"Add", "Fix", "Rename", "Change", "Test"}
  assert any(m.startswith("Add a parameter to ") for m in messages)
  assert any(m.startswith("Add toolkit/") for m in messages)
  assert _git(path, "status", "--porcelain") == ""
  assert len(set(messages)) > COMMITS * 0.9
  # One check per function, and more tests than checks.
  for name in os.listdir(path / "checks"):
    check = (path / "checks" / name).read_text()
    imported = check.split(" import ")[1].split("\n")[0].split(", ")
    assert [line.split("(")[0] for line in check.splitlines()
            if line.startswith("assert ")] == [f"assert {f}" for f in imported]
    assert (path / "tests" / name).read_text().count("assert ") > len(imported)


def test_made_up_nouns_name_every_module_and_differ_from_the_real_ones(tmp_path):
  sys.path.insert(0, os.path.dirname(SCRIPT))
  try:
    import make_edit_history as meh
  finally:
    sys.path.pop(0)
  nouns = meh.made_up_nouns(50, seed=1)
  assert len({n for n, _ in nouns}) == 50 and nouns == meh.made_up_nouns(50, seed=1)
  assert nouns != meh.made_up_nouns(50, seed=2)
  assert all(n.isidentifier() and plural == n + "s" for n, plural in nouns)
  assert not {n for n, _ in nouns} & {n for n, _ in meh.NOUNS}
  r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "repo"), "--seed", "1",
                      "--commits", "12", "--made-up-nouns", "50"],
                     capture_output=True, text=True, check=True)
  assert "12 commits" in r.stdout
  modules = {f[:-3] for f in os.listdir(tmp_path / "repo" / "toolkit") if f != "__init__.py"}
  assert modules and modules <= {plural for _, plural in nouns}


def test_tasks_carry_hidden_and_visible_tests(mined):
  for granularity in ("pr", "file", "hunk"):
    splits = mined.by_granularity[granularity]
    assert splits["train"] and splits["test"]
    for task in splits["train"] + splits["test"]:
      assert task.tests.count("assert ") > task.extra.tests_visible.count("assert ") > 0
      assert task.extra.tests_format == "script" and task.extra.assemble == "files"
      edited = set(task.extra.files) | set(task.extra.oracle)
      assert "toolkit/__init__.py" in {**task.extra.support_files, **task.extra.files}
      assert not edited & set(task.extra.support_files)


def _pre_state_job(task, tests: str) -> sandbox.Job:
  """The tests run against the task's files as they are: the answer that changes nothing."""
  return files_job({**task.extra.support_files, **task.extra.files}, tests, "script")


def test_the_tests_imports_of_the_package_move_to_the_program():
  tests = ("import math\nfrom toolkit.prices import (cap_price,\n    floor_price)\n"
           "import toolkit.labels as labels\n\nassert cap_price(math.inf) == 20\n")
  moved, rest = split_file_imports(tests, ["toolkit/__init__.py", "toolkit/prices.py"])
  assert moved == ("from toolkit.prices import (cap_price,\n    floor_price)\n"
                   "import toolkit.labels as labels\n")
  assert rest == "import math\n\nassert cap_price(math.inf) == 20\n"


@pytest.mark.slow
def test_oracle_edits_pass_the_tests_and_doing_nothing_fails_a_bug_fix(mined):
  tasks = mined.by_granularity["pr"]["train"] + mined.by_granularity["pr"]["test"]
  references = [t.reference for t in tasks]
  out = registry.compute({"tests": 1.0, "diff": 1.0}, tasks, references,
                         options={"tests": {"workers": 2}})
  # Every PR's real change passes its hidden tests and is its own oracle.
  np.testing.assert_array_equal(out.scores, np.full(len(tasks), 2.0, np.float32))
  visible = registry.compute({"tests": 1.0}, tasks, references,
                             options={"tests": {"workers": 2, "test_set": "visible"}})
  assert visible.metrics["tests/pass_rate"] == 1.0
  fixes = [t for t in tasks if t.prompt.split("BEGIN REQUEST ---\n")[1].startswith("Fix ")]
  assert fixes
  box = sandbox.Sandbox(workers=2)
  hidden = box.run_many([_pre_state_job(t, t.tests) for t in fixes])
  weak = box.run_many([_pre_state_job(t, t.extra.tests_visible) for t in fixes])
  # The bug is in the context: the hidden tests catch it, the one check per
  # function does not.
  assert [r.status for r in hidden] == ["failed"] * len(fixes)
  assert [r.passed for r in weak] == [True] * len(fixes)


def test_hunk_oracles_pass_the_hidden_tests(mined):
  tasks = mined.by_granularity["hunk"]["test"][:12]
  out = registry.compute({"tests": 1.0}, tasks, [t.reference for t in tasks],
                         options={"tests": {"workers": 2}})
  assert out.metrics["tests/pass_rate"] == 1.0
  # An answer that does not apply scores 0 without running the tests.
  miss = ("<think>edit</think>\n<solution>\n```python\n### toolkit/__init__.py\n"
          "<<<<<<< SEARCH\nnot in the file\n=======\nx = 1\n>>>>>>> REPLACE\n```\n</solution>")
  out = registry.compute({"tests": 1.0}, tasks[:2], [miss, miss],
                         options={"tests": {"workers": 2}})
  assert out.scores.tolist() == [0.0, 0.0]
