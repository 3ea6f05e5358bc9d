"""The tool-use workspace of an executable PR task: the repository at its base commit.

An episode (rlcode.agent.env) starts from the repository's text files at the base
commit, without the test patch (SWE-bench withholds it), in a sandbox session that has
the task's test environment bound read-only and on PYTHONPATH, so that `python3 -m
pytest` works from bash. Its answer is the workspace's diff against the base, written in
the task's edit format (rlcode.data.edits.oracle_completion), which the rewards apply to
the base (rlcode.rewards.swe): a deleted file is written as emptied, and the session's
caches (.pytest_cache, __pycache__, .hypothesis) are not part of it. run_tests runs the
task's test files that exist at the base (the visible ones: the test patch stays
withheld) on the answer, in a sandbox of its own; lint checks the changed Python files.

`gold_calls` is the scripted agent that applies the gold patch through the editor: one
str_replace per hunk (its search text widened until it occurs once), a create for a new
file or where a replacement would be ambiguous, then finish.

This module must not score (rlcode.rewards.swe) nor know about tokens or training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcode import sandbox
from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.sandbox.session import SessionError
from rlcode.swe import deps, tasks, testenv
from rlcode.swe.runner import Runner, TestRun

STATEMENT_CHARS = 2000
_SKIPPED_DIRS = (".pytest_cache", "__pycache__", ".hypothesis")
_THOUGHT = "The workspace's changes."


def _skipped(path: str) -> bool:
  return any(part in _SKIPPED_DIRS for part in path.split("/")) or path.startswith(".rlcode")


def workspace_changes(session, base: Mapping[str, str]) -> dict[str, str]:
  """path -> text of every file whose text differs from the base ("" for a deleted one)."""
  now = {}
  for path in session.files():
    if _skipped(path):
      continue
    try:
      now[path] = session.read(path)
    except SessionError:  # too large to read: not an answer anyone can score
      continue
  out = {p: t for p, t in now.items() if base.get(p) != t}
  out.update({p: "" for p in base if p not in now and base[p]})
  return out


def answer_text(task: Task, base: Mapping[str, str], changes: Mapping[str, str]) -> str:
  """The changes as a completion in the task's edit format ("" if it cannot say them)."""
  if not changes:
    return ""
  before = {p: base.get(p, "") for p in changes}
  try:
    return edits.oracle_completion(before, dict(changes), task.extra.edit_format,
                                   thought=_THOUGHT)
  except ValueError:
    return ""


def result_of(task: Task, run: TestRun, tests: tuple[str, ...]) -> sandbox.Result:
  """A test run as the tools read it (rlcode.sandbox.Result)."""
  failing = sorted(t for t, o in run.outcomes.items() if o not in ("passed", "xfailed"))
  errors = list(run.collect_errors)
  passed = len(run.passing())
  total = passed + len(failing) + len(errors)
  if run.status != "ok":
    status, error = ("timeout" if run.status == "timeout" else "crash"), run.status
  elif failing or errors or not total:
    status = "failed"
    error = (f"{failing[0]} {run.outcomes[failing[0]]}" if failing else
             f"{errors[0]} did not collect" if errors else f"no test ran in {list(tests)}")
  else:
    status, error = "passed", ""
  return sandbox.Result(status=status, tests_total=total, tests_run=total,
                        tests_passed=passed, complete=run.status == "ok", error=error)


class SweWorkspace:
  """rlcode.agent.workspace's interface for tasks of kind "swe" (module docstring)."""

  def __init__(self):
    self.runner = Runner(use_cache=False)

  def statement(self, task: Task) -> str:
    text = tasks.statement(task)
    if len(text) > STATEMENT_CHARS:
      text = text[:STATEMENT_CHARS] + "\n[... the request is cut here]"
    return text

  def files(self, task: Task) -> Mapping[str, str]:
    return tasks.base_files(task)

  def session_options(self, task: Task) -> dict[str, Any]:
    base = tasks.base_files(task)
    env = testenv.build(task.extra.test_deps, exclude=deps.top_level_names(base))
    path = ":".join([testenv.MOUNT] + ["/sandbox" if p == "." else f"/sandbox/{p}"
                                       for p in task.extra.python_path])
    return {"mounts": {testenv.MOUNT: env.path}, "env": {"PYTHONPATH": path}}

  def answer(self, session, task: Task) -> str:
    base = tasks.base_files(task)
    return answer_text(task, base, workspace_changes(session, base))

  def run_tests(self, task: Task, answer: str, box: sandbox.Sandbox) -> sandbox.Result:
    base = tasks.base_files(task)
    visible = tuple(f for f in task.extra.test_files if f in base)
    if not visible:
      return sandbox.Result(status="failed", tests_total=0, complete=True,
                            error="the task has no visible test file (its tests are new)")
    try:
      changes = tasks.candidate_changes(task, answer, base) if answer else {}
    except edits.FormatError as e:
      return sandbox.Result(status="failed", tests_total=0, complete=True,
                            error=f"the workspace's diff does not apply: {e}")
    tree = tasks.evaluation_tree(base, "", changes)
    return result_of(task, self.runner.run(tasks.run_spec(task, tree, visible)), visible)

  def lint_files(self, session, task: Task) -> dict[str, str]:
    changed = workspace_changes(session, tasks.base_files(task))
    return {p: t for p, t in changed.items() if t}

  def scripted_calls(self, task: Task) -> list[tuple]:
    return gold_calls(task)


def _replacements(old: str, new: str, path: str) -> list[tuple[str, str]] | None:
  """(old_str, new_str) pairs that take `old` to `new` by the editor's str_replace (each
  old_str occurring once when it is applied), or None."""
  blocks = edits.search_replace.file_blocks(path, old, new, context=1)
  pairs = edits.parse_search_replace("\n".join(blocks)).get(path, [])
  text = old
  for search, replace in pairs:
    if not search or text.count(search) != 1:
      return None
    text = text.replace(search, replace, 1)
  return pairs if text == new else None


def gold_calls(task: Task) -> list[tuple[str, dict]]:
  """The scripted agent's calls that apply the gold patch (module docstring)."""
  base = tasks.base_files(task)
  calls = []
  for path, new in sorted(tasks.gold_changes(task, base).items()):
    new = new or ""
    old = base.get(path)
    pairs = _replacements(old, new, path) if old else None
    if pairs is None:
      calls.append(("editor", {"command": "create", "path": path, "file_text": new}))
      continue
    calls += [("editor", {"command": "str_replace", "path": path, "old_str": s,
                          "new_str": r}) for s, r in pairs]
  return calls + [("finish", {})]


def gold_answer(task: Task) -> str:
  """The gold patch as a completion in the task's edit format (what `gold_calls` leave)."""
  base = tasks.base_files(task)
  changes = {p: t or "" for p, t in tasks.gold_changes(task, base).items()}
  return answer_text(task, base, changes)

