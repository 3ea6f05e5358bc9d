"""HumanEval tasks: the builder, and the sandbox on all 164 reference and empty completions."""

from __future__ import annotations

import pytest
import json

from rlcode.data.extras import CodeExtra
from rlcode import cli
from rlcode.evaluation import scoring
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
  assert all(t.extra == CodeExtra(assemble="prompt+completion") for t in tasks)


def test_builder_round_trips_through_array_record(tmp_path):
  builder = HumanEval(data_dir=str(tmp_path))
  loaded = load_tasks(builder, "test")
  assert sorted(loaded, key=lambda t: t.id) == sorted(humaneval_tasks(), key=lambda t: t.id)
  assert list(builder.info.splits) == ["test"]
  assert builder.info.file_format.value == "array_record"


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _cli_eval(tmp_path, name, completions, capsys):
  path = _write(tmp_path / f"{name}.jsonl", completions)
  out = tmp_path / name
  assert cli.main(["eval", "--tasks", "humaneval", "--completions", str(path),
                   "--out", str(out), "--workers", "2"]) == 0
  assert "pass@1" in capsys.readouterr().out
  return json.loads((out / scoring.REPORT_NAME).read_text())


@pytest.mark.slow
def test_references_pass_and_empty_completions_fail(tmp_path, capsys):
  """The issue's acceptance check, through the CLI: `rlcode eval --tasks humaneval`
  gives pass@1 = 1.0 on the references and 0.0 on empty completions."""
  tasks = humaneval_tasks()
  report = _cli_eval(tmp_path, "refs", [{"task_id": t.id, "completion": t.reference}
                                        for t in tasks], capsys)
  assert report["pass_at_k"] == {"pass@1": 1.0}
  assert report["k_skipped"] == [10, 100]
  assert report["status_counts"] == {"passed": 164}
  report = _cli_eval(tmp_path, "empty", [{"task_id": t.id, "completion": ""} for t in tasks],
                     capsys)
  assert report["pass_at_k"] == {"pass@1": 0.0}
  assert report["status_counts"] == {"failed": 164}
