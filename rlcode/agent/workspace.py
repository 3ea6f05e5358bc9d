"""How an episode's workspace is made from its task and read back, by the task's kind.

The environment (rlcode.agent.env) and the tools (rlcode.agent.tools) never read a task's
extra fields themselves; they ask the task's `Workspace`:
  statement(task)             the episode's first observation
  files(task)                 the files the session starts with
  session_options(task)       extra arguments of the session (read-only mounts, environment)
  answer(session, task)       the text the rewards score when the episode ends (raises
                              SessionError when the workspace cannot give one)
  run_tests(task, answer, box)  the visible tests' sandbox.Result on that answer
  lint_files(session, task)   path -> text of the files the lint tool checks
  scripted_calls(task)        the calls of a scripted agent that solves the task, or None
                              (tasks whose demonstrator lives elsewhere: rlcode.agent.expert)

"code" tasks (`CodeWorkspace`): the task's `extra.files`; the answer is the solution file
(`extra.solution`), tested as a program against the visible tests (rlcode.rewards.tests).
"swe" tasks: a real repository at a commit (rlcode.swe.workspace). Workspaces of other
kinds are imported on first use from `_KINDS`.

This module must not know about tokens, sampling or training.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from rlcode import sandbox
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.rewards.tests import job_for
from rlcode.sandbox.session import SessionError


class CodeWorkspace:
  """A handful of files and one solution file, tested as a program."""

  def statement(self, task: Task) -> str:
    return task.prompt

  def files(self, task: Task) -> Mapping[str, str]:
    return task.extra.files

  def session_options(self, task: Task) -> dict[str, Any]:
    return {}

  def answer(self, session, task: Task) -> str:
    """The solution file's text; raises SessionError when it cannot be read."""
    return session.read(task.extra.solution)

  def run_tests(self, task: Task, answer: str, box: sandbox.Sandbox) -> sandbox.Result:
    test_set = "visible" if task.extra.tests_visible else "hidden"
    return box.run(job_for(task, answer, test_set=test_set))

  def lint_files(self, session, task: Task) -> dict[str, str]:
    try:
      return {task.extra.solution: session.read(task.extra.solution)}
    except SessionError:
      return {}

  def scripted_calls(self, task: Task) -> list[tuple] | None:
    return None


_KINDS = {"code": ("rlcode.agent.workspace", "CodeWorkspace"),
          "swe": ("rlcode.swe.workspace", "SweWorkspace")}
_MADE: dict[str, Any] = {}


def workspace_for(task: Task):
  """The Workspace of the task's kind."""
  if task.kind not in _MADE:
    if task.kind not in _KINDS:
      raise BadInput(f"task {task.id!r}: kind {task.kind!r} has no tool-use workspace; "
                     f"kinds that do: {sorted(_KINDS)}")
    module, name = _KINDS[task.kind]
    _MADE[task.kind] = getattr(importlib.import_module(module), name)()
  return _MADE[task.kind]
