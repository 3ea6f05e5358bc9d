"""HumanEval tasks: the builder, and the sandbox on all 164 reference and empty completions."""

from __future__ import annotations

import json

from rlcode import evaluate
from rlcode.data.humaneval import N_PROBLEMS, HumanEval, humaneval_tasks
from rlcode.data.tasks import load_tasks


def test_humaneval_tasks_fields():
  tasks = humaneval_tasks()
  assert len(tasks) == N_PROBLEMS == 164
  assert [t.id for t in tasks] == [f"HumanEval/{i}" for i in range(164)]
  first = tasks[0]
  assert first.entry_point == "has_close_elements" and first.kind == "code"
  assert first.prompt.startswith("from typing import List")
  assert "def check(candidate)" in first.tests
  assert first.reference.strip().startswith("for idx, elem in enumerate(numbers)")
  assert all(t.extra == {"assemble": "prompt+completion"} for t in tasks)


def test_builder_round_trips_through_array_record(tmp_path):
  builder = HumanEval(data_dir=str(tmp_path))
  loaded = load_tasks(builder, "test")
  assert sorted(loaded, key=lambda t: t.id) == sorted(humaneval_tasks(), key=lambda t: t.id)
  assert list(builder.info.splits) == ["test"]
  assert builder.info.file_format.value == "array_record"


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_references_pass_and_empty_completions_fail(tmp_path):
  """The issue's acceptance check: pass@1 = 1.0 on references, 0.0 on empty completions."""
  tasks = humaneval_tasks()
  refs = _write(tmp_path / "refs.jsonl",
                [{"task_id": t.id, "completion": t.reference} for t in tasks])
  report = evaluate.evaluate_completions_file(tasks, refs, out_dir=tmp_path / "refs", workers=2)
  assert report["pass_at_k"] == {"pass@1": 1.0}
  assert report["k_skipped"] == [10, 100]
  assert report["status_counts"] == {"passed": 164}
  empty = _write(tmp_path / "empty.jsonl", [{"task_id": t.id, "completion": ""} for t in tasks])
  report = evaluate.evaluate_completions_file(tasks, empty, out_dir=tmp_path / "empty", workers=2)
  assert report["pass_at_k"] == {"pass@1": 0.0}
  assert report["status_counts"] == {"failed": 164}
