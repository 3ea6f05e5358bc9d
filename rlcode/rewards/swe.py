"""The executable PR reward: a completion's change run against the task's own tests.

Registers "swe_tests" for tasks of kind "swe" (rlcode.swe): the completion (an answer in
the task's edit format; an agent episode's is its workspace's diff written in that
format) is applied to the repository at the base commit, the test patch is applied on
top, and the task's test files run with pytest in the sandbox (rlcode.swe.tasks,
rlcode.swe.runner). Per completion: `resolved` (every FAIL_TO_PASS and PASS_TO_PASS test
passes: SWE-bench's FULL) and `fail_to_pass` (the fraction of FAIL_TO_PASS tests that
pass). The score is one of them (option `mode`: "resolved", 1 or 0, the default; or
"fail_to_pass"); an answer that does not apply scores 0.

Also gives the SWE-RL diff reward ("diff", rlcode.rewards.diffs) its view of a swe task:
the base text of every file the gold patch or the answer changes, the gold's new texts
and the answer's (`diff_view`), so that a config weighs both:
`rewards = {"swe_tests": 1.0, "diff": 0.2}`.

What this does not defend: the candidate's code runs in the interpreter that runs its
tests (as in SWE-bench), so code that patches pytest from inside the package could forge
its outcome; the cheap ways (editing the tests or conftest.py, a sitecustomize.py, a
module that shadows pytest) are closed (rlcode.swe.tasks.evaluation_tree,
rlcode.swe.runner.command).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.rewards.diffs import register_view
from rlcode.rewards.registry import RewardOutput, register
from rlcode.swe import patches, tasks
from rlcode.swe.runner import Runner, TestRun

MODES = ("resolved", "fail_to_pass")


def outcome(task: Task, run: TestRun) -> dict[str, Any]:
  """resolved, fail_to_pass (fraction) and pass_to_pass (all pass) of a task's run."""
  passing = run.passing()
  f2p, p2p = set(task.extra.fail_to_pass), set(task.extra.pass_to_pass)
  fraction = len(f2p & passing) / len(f2p) if f2p else 0.0
  p2p_ok = p2p <= passing
  return {"resolved": bool(f2p) and fraction == 1.0 and p2p_ok, "fail_to_pass": fraction,
          "pass_to_pass": p2p_ok, "status": run.status}


def check(tasks_: Sequence[Task], completions: Sequence[str]) -> None:
  if len(tasks_) != len(completions):
    raise ValueError(f"{len(tasks_)} tasks but {len(completions)} completions")
  for task in tasks_:
    if task.kind != "swe":
      raise ValueError(f"task {task.id!r} has kind {task.kind!r}; the swe_tests reward "
                       "needs kind 'swe'")


def evaluate(tasks_: Sequence[Task], completions: Sequence[str], *, workers: int = 0,
             runner: Runner | None = None) -> list[dict[str, Any]]:
  """Per completion, `outcome` of its tests, or {"error", "message"} when it does not
  apply. Identical (task, completion) pairs run once."""
  check(tasks_, completions)
  runner = runner or Runner(use_cache=False)
  details: list[dict[str, Any]] = [{} for _ in completions]
  specs, where = {}, {}
  for i, (task, completion) in enumerate(zip(tasks_, completions)):
    key = (task.id, completion)
    if key in where:
      where[key].append(i)
      continue
    base = tasks.base_files(task)
    try:
      changes = tasks.candidate_changes(task, completion, base)
      tree = tasks.evaluation_tree(base, task.extra.test_patch, changes)
    except edits.FormatError as e:
      details[i] = {"error": e.code, "message": str(e)[:300], "resolved": False,
                    "fail_to_pass": 0.0}
      continue
    where[key] = [i]
    specs[key] = tasks.run_spec(task, tree)
  keys = list(specs)
  runs = runner.run_many([specs[k] for k in keys], workers=workers or _cpus())
  for key, run in zip(keys, runs):
    task = tasks_[where[key][0]]
    for i in where[key]:
      details[i] = outcome(task, run)
  for key, idx in where.items():  # duplicates of a pair that did not apply
    if key not in specs:
      for i in idx[1:]:
        details[i] = details[idx[0]]
  return details


def _cpus() -> int:
  import os
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:
    return max(1, os.cpu_count() or 1)


@register("swe_tests")
def swe_tests_reward(tasks_: Sequence[Task], completions: Sequence[str],
                     mode: str = "resolved", workers: int = 0,
                     cache: bool = False) -> RewardOutput:
  """`mode`'s score per completion (module docstring). Metrics: resolved,
  fail_to_pass (mean fraction), pass_to_pass (share whose PASS_TO_PASS all pass),
  applied (share of answers that apply)."""
  if mode not in MODES:
    raise ValueError(f"swe_tests: mode={mode!r}; expected one of {MODES}")
  details = evaluate(tasks_, completions, workers=workers,
                     runner=Runner(use_cache=True) if cache else None)
  scores = np.array([float(d["resolved"]) if mode == "resolved" else d["fail_to_pass"]
                     for d in details], np.float32)
  n = max(len(details), 1)
  metrics = {
      "resolved": sum(d["resolved"] for d in details) / n,
      "fail_to_pass": sum(d["fail_to_pass"] for d in details) / n,
      "pass_to_pass": sum(bool(d.get("pass_to_pass")) for d in details) / n,
      "applied": sum("error" not in d for d in details) / n,
  }
  return RewardOutput(scores, metrics, details)


@register_view("swe")
def diff_view(task: Task, completion: str) -> tuple[dict, dict, dict]:
  """(base texts, gold's new texts, the answer's new texts) of the code files either
  changes (test paths left out, as the tests reward drops them); deleted is "".
  Raises edits.FormatError when the answer does not apply."""
  base = tasks.base_files(task)
  predicted = {p: t for p, t in tasks.candidate_changes(task, completion, base).items()
               if not patches.is_test_path(p)}
  oracle = {p: t or "" for p, t in tasks.gold_changes(task, base).items()}
  files = {p: base.get(p, "") for p in set(oracle) | set(predicted)}
  return files, oracle, predicted
