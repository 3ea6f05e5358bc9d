"""Decomposition checked by tests: which FAIL_TO_PASS tests each part of a PR makes pass.

A task's gold patch is cut into parts, at "file" granularity (each file it changes) or
"hunk" (each run of changed lines of each file, as rlcode.data.edits.line_hunks cuts them
with 3 lines of context: rlcode.data.git.units' hunks). For each part the tests run on
the base with the test patch and every other part of the gold patch applied (the part
withheld); the FAIL_TO_PASS tests that then fail are the ones the part makes pass with the
rest of the PR in place. A part is "checked" when at least one test does (it
distinguishes the part); an unchecked part is one the task's tests cannot see.

A PR of one part withholds everything: that is the empty patch, which validation already
ran (every FAIL_TO_PASS test fails), so its part is checked without a run. Runs go
through rlcode.swe.runner (cached by tree) on the FAIL_TO_PASS tests' functions alone.

This module must not mine nor score answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rlcode.data import edits
from rlcode.data.tasks import Task
from rlcode.swe import tasks, validate
from rlcode.swe.runner import Runner

GRANULARITIES = ("file", "hunk")


@dataclasses.dataclass(frozen=True)
class Part:
  """One part of a gold patch: its id and the changes of the patch without it."""

  id: str
  rest: Mapping[str, str | None]


def parts(task: Task, granularity: str, base: Mapping[str, str] | None = None) -> list[Part]:
  """The task's gold patch cut at `granularity` (module docstring)."""
  if granularity not in GRANULARITIES:
    raise ValueError(f"granularity={granularity!r}; expected one of {GRANULARITIES}")
  base = base if base is not None else tasks.base_files(task)
  gold = tasks.gold_changes(task, base)
  out = []
  for path in sorted(gold):
    if granularity == "file":
      rest = {p: t for p, t in gold.items() if p != path}
      out.append(Part(f"{task.id}:{path}", rest))
      continue
    pre, post = base.get(path, ""), gold[path] or ""
    a, b, hunks = edits.line_hunks(pre, post)
    for k, (i1, i2, j1, j2) in enumerate(hunks, 1):
      undone = "".join(b[:j1] + a[i1:i2] + b[j2:])
      # Undoing the only hunk of an added file leaves no file; of a deleted one, the file.
      text = None if path not in base and not undone else undone
      out.append(Part(f"{task.id}:{path}#{k}", {**gold, path: text}))
  return out


@dataclasses.dataclass(frozen=True)
class Checked:
  """What one part's run said: the FAIL_TO_PASS tests it makes pass."""

  task: str
  part: str
  granularity: str
  parts_in_pr: int
  makes_pass: tuple[str, ...]
  ran: bool
  status: str

  @property
  def checked(self) -> bool:
    return bool(self.makes_pass)


def check(tasks_: Sequence[Task], granularity: str, runner: Runner, *,
          workers: int = 1, progress: bool = False) -> list[Checked]:
  """Every part of every task at `granularity`, with the FAIL_TO_PASS tests it makes pass.

  A run that does not finish (timeout, crash) names no test: its part counts as
  unchecked, with the run's status recorded."""
  jobs, out = [], []
  for task in tasks_:
    base = tasks.base_files(task)
    cut = parts(task, granularity, base)
    f2p = tuple(task.extra.fail_to_pass)
    if len(cut) == 1:
      out.append(Checked(task.id, cut[0].id, granularity, 1, f2p, False, "empty_patch"))
      continue
    for part in cut:
      tree = tasks.evaluation_tree(base, task.extra.test_patch, part.rest)
      jobs.append((task, part, len(cut),
                   tasks.run_spec(task, tree, validate.functions(f2p))))
  runs = runner.run_many([spec for *_, spec in jobs], workers=workers, progress=progress,
                         desc=f"{granularity} parts")
  for (task, part, n, _), run in zip(jobs, runs):
    passing = run.passing() if run.status == "ok" else frozenset(task.extra.fail_to_pass)
    makes = tuple(sorted(set(task.extra.fail_to_pass) - passing))
    out.append(Checked(task.id, part.id, granularity, n, makes, True, run.status))
  return sorted(out, key=lambda c: c.part)


def summary(checked: Sequence[Checked]) -> dict:
  """PR tasks, parts, checked parts, PRs whose every part is checked, and the distribution
  of parts per PR (1, 2, 3-4, 5-8, 9+)."""
  by_task: dict[str, list[Checked]] = {}
  for c in checked:
    by_task.setdefault(c.task, []).append(c)
  bins = {"1": 0, "2": 0, "3-4": 0, "5-8": 0, "9+": 0}
  for cs in by_task.values():
    n = len(cs)
    bins["1" if n == 1 else "2" if n == 2 else "3-4" if n <= 4 else "5-8" if n <= 8
         else "9+"] += 1
  n_checked = sum(c.checked for c in checked)
  return {"tasks": len(by_task), "parts": len(checked), "checked": n_checked,
          "checked_share": n_checked / len(checked) if checked else 0.0,
          "tasks_all_checked": sum(all(c.checked for c in cs) for cs in by_task.values()),
          "multi_part_tasks": sum(len(cs) > 1 for cs in by_task.values()),
          "checked_in_multi_part": sum(c.checked for c in checked if c.parts_in_pr > 1),
          "parts_in_multi_part": sum(c.parts_in_pr > 1 for c in checked),
          "unfinished_runs": sum(c.status not in ("ok", "empty_patch") for c in checked),
          "parts_per_pr": bins}
