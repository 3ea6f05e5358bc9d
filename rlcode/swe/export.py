"""Executable PR tasks in SWE-bench's JSON-lines format, written and read back.

Each line is one instance with SWE-bench's fields: instance_id, repo, base_commit, patch,
test_patch, problem_statement, hints_text (""), created_at (the PR's commit time, ISO
8601 UTC), version (""), FAIL_TO_PASS and PASS_TO_PASS (lists of pytest node ids that
run from the repository's root) and environment_setup_commit (the base commit), so the
file loads with SWE-bench's own `load_swebench_dataset`. Our own fields ride in one more
key, "rlcode": where the history lives, the PR's commit, the test files, test
dependencies, import path, hypothesis budget, timeout, time and edit format.

`read` makes Tasks again: the prompt and reference are rebuilt from the history (the base
texts of the files the patch touches), so write then read gives the same tasks. A line
without "rlcode" (an instance from elsewhere) needs `repo`, the history to read; its test
files are the test modules its test patch leaves, and its dependencies and import path
are read from the repository after the patches (rlcode.swe.deps).

This module must not mine or run tests.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterable

from rlcode.data.jsonl import json_objects
from rlcode.data.tasks import Task
from rlcode.errors import BadInput
from rlcode.swe import deps, patches, tasks

FILE_NAME = "swe_tasks.jsonl"
FIELDS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement",
          "hints_text", "created_at", "version", "FAIL_TO_PASS", "PASS_TO_PASS",
          "environment_setup_commit")
_OURS = ("repo", "commit", "test_files", "test_deps", "python_path", "hypothesis_examples",
         "timeout", "time", "edit_format")


def to_row(task: Task) -> dict:
  """A task as one SWE-bench instance (module docstring)."""
  x = task.extra
  created = datetime.datetime.fromtimestamp(x.time, datetime.timezone.utc)
  return {
      "instance_id": task.id, "repo": x.repo_name, "base_commit": x.base_commit,
      "patch": x.patch, "test_patch": x.test_patch,
      "problem_statement": tasks.request_of(task), "hints_text": "",
      "created_at": created.isoformat().replace("+00:00", "Z"), "version": "",
      "FAIL_TO_PASS": list(x.fail_to_pass), "PASS_TO_PASS": list(x.pass_to_pass),
      "environment_setup_commit": x.base_commit,
      "rlcode": {k: (list(v) if isinstance(v, tuple) else v)
                 for k, v in ((k, getattr(x, k)) for k in _OURS)},
  }


def write(path: str, tasks_: Iterable[Task]) -> int:
  """Writes the tasks (sorted by id) as JSON lines; returns how many."""
  rows = [to_row(t) for t in sorted(tasks_, key=lambda t: t.id)]
  tmp = f"{path}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row, sort_keys=True) + "\n")
  os.replace(tmp, path)
  return len(rows)


def _node_ids(value, where: str, name: str) -> list[str]:
  if isinstance(value, str):  # SWE-bench's datasets on the Hub store them JSON-encoded
    try:
      value = json.loads(value)
    except ValueError:
      raise BadInput(f"{where}: {name} is neither a list nor a JSON list") from None
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    raise BadInput(f"{where}: {name} must be a list of node ids")
  return value


def from_row(row: dict, where: str = "row", repo: str | None = None) -> Task:
  """The Task of one instance (module docstring)."""
  missing = [f for f in ("instance_id", "repo", "base_commit", "patch", "test_patch",
                         "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS") if f not in row]
  if missing:
    raise BadInput(f"{where}: no field {missing[0]!r}")
  ours = row.get("rlcode")
  if ours is None:
    if repo is None:
      raise BadInput(f"{where}: an instance without our 'rlcode' fields needs repo= (the "
                     "history to read its files from)")
    ours = {"repo": repo, "commit": "", "time": 0, "edit_format": "unified_diff"}
  elif not isinstance(ours, dict):
    raise BadInput(f"{where}: 'rlcode' must be an object")
  ours = dict(ours)
  if repo is not None:
    ours["repo"] = repo
  probe = Task(id=row["instance_id"], prompt="", kind="swe", extra={
      "repo": ours["repo"], "base_commit": row["base_commit"]})
  try:
    base = tasks.base_files(probe)
    code_after = patches.apply(base, row["patch"])
    tests_after = patches.apply(base, row["test_patch"])
  except ValueError as e:
    raise BadInput(f"{where}: {e}") from None
  after = patches.applied(patches.applied(dict(base), row["test_patch"]), row["patch"])
  test_files = ours.get("test_files") or sorted(
      p for p, t in tests_after.items() if t is not None and patches.is_test_module(p))
  return tasks.make_task(
      instance_id=row["instance_id"], request=row["problem_statement"], repo=ours["repo"],
      repo_name=row["repo"], base_commit=row["base_commit"], commit=ours.get("commit", ""),
      time=int(ours.get("time", 0)), base=base, code_after=code_after,
      tests_after=tests_after,
      fail_to_pass=_node_ids(row["FAIL_TO_PASS"], where, "FAIL_TO_PASS"),
      pass_to_pass=_node_ids(row["PASS_TO_PASS"], where, "PASS_TO_PASS"),
      test_files=test_files,
      test_deps=ours.get("test_deps", deps.declared_deps(after)),
      python_path=ours.get("python_path", deps.python_path(after)),
      hypothesis_examples=int(ours.get("hypothesis_examples", 0)),
      timeout=float(ours.get("timeout", 120.0)),
      edit_format=ours.get("edit_format", "unified_diff"))


def read(path: str, repo: str | None = None) -> list[Task]:
  """The tasks of a SWE-bench JSON-lines file, sorted by id; `repo` overrides (or, for
  instances without our fields, gives) the history their files are read from."""
  out = [from_row(row, where, repo) for where, row in json_objects(path)]
  return sorted(out, key=lambda t: t.id)

