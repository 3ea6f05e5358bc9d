"""`rlcode mine SOURCE[@BRANCH] --tasks swe --out DIR`: mine executable PR tasks, store,
count.

Mines the history (a progress bar on stderr), writes the tfds dataset (SweTasks) under
DIR and the tasks in SWE-bench's JSON-lines format as DIR/swe_tasks.jsonl, and prints the
counts: PRs walked, those that change code and tests, runnable, kept, validated, skipped
by reason, the tasks per split and the wall clock, ending with the line
`swe tasks: N`. Bad input raises BadInput (one line, exit 2, from rlcode.cli).

This module must not mine or decide anything itself: it parses, calls rlcode.swe and
prints.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys

import tensorflow_datasets as tfds
from absl import logging

from rlcode.errors import BadInput
from rlcode.swe import export
from rlcode.swe.builder import SweTasks
from rlcode.swe.config import SweConfig
from rlcode.swe.mining import mine


DEFAULTS = {"workers": 0, "timeout": 120.0, "hypothesis_examples": 20, "gold_runs": 8,
            "repo_name": "", "cache_dir": None}


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """The options only --tasks swe reads (rlcode.mine adds the shared ones)."""
  swe = parser.add_argument_group("--tasks swe")
  swe.add_argument("--workers", type=int, default=DEFAULTS["workers"],
                   help="PRs evaluated at once (default: the CPUs plus one)")
  swe.add_argument("--timeout", type=float, default=DEFAULTS["timeout"],
                   help="wall clock of one pytest run, seconds (default 120)")
  swe.add_argument("--hypothesis-examples", type=int, default=DEFAULTS["hypothesis_examples"],
                   help="examples per hypothesis test (0: the tests' own; default 20)")
  swe.add_argument("--gold-runs", type=int, default=DEFAULTS["gold_runs"],
                   help="runs of the gold patch that must pass every FAIL_TO_PASS test, "
                        "each with its own hash seed (default 8: a test failing 4 runs in "
                        "10 gets through 1.7%% of the time)")
  swe.add_argument("--repo-name", default=DEFAULTS["repo_name"], metavar="OWNER/NAME",
                   help="the repository's owner/name in the SWE-bench export and task ids "
                        "(default: from the origin URL, else local/NAME)")
  swe.add_argument("--cache-dir", default=DEFAULTS["cache_dir"],
                   help="where runs and verdicts are cached (default ~/.cache/rlcode/swe)")


def _date(t: int) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d")


def format_table(report: dict, dataset: str, jsonl: str) -> str:
  """The counts of a report, one row each; the last row is `swe tasks: N`."""
  rows = [("source", f"{report['source']} @ {report['branch']} ({report['head'][:12]})"),
          ("walked (first-parent commits)", report["walked"]),
          ("with tests changed (code and tests)", report["with_tests"]),
          ("runnable (tests ran at both commits)", report["runnable"]),
          ("kept (>= 1 FAIL_TO_PASS)", report["kept"]),
          ("validated (gold passes, empty fails)", report["validated"]),
          ("gold runs each passed / repo", f"{report['gold_runs']} / {report['repo_name']}"),
          ("skipped", sum(report["skipped"].values()))]
  for reason, n in report["skipped"].items():
    span = report["skip_times"].get(reason)
    when = f"  ({_date(span[0])} .. {_date(span[1])})" if span else ""
    rows.append((f"  {reason}", f"{n}{when}"))
  rows += [("tasks: train / test", f"{report['tasks']['train']} / {report['tasks']['test']}"),
           ("FAIL_TO_PASS / PASS_TO_PASS tests", f"{report['fail_to_pass']} / "
                                                 f"{report['pass_to_pass']}"),
           ("pytest runs (made / cached)", f"{report['runs']} / {report['runs_cached']}"),
           ("wall clock", f"{report['seconds']:.0f} s on {report['workers']} workers"),
           ("python / pytest", f"{report['python']} / "
                               f"{report['test_environment'].get('pytest', '?')}"),
           ("dataset", dataset), ("SWE-bench JSON lines", jsonl)]
  width = max(len(name) for name, _ in rows)
  lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
  lines.append(f"swe tasks: {report['validated']}")
  return "\n".join(lines)


def run(args: argparse.Namespace, source: str, branch: str) -> int:
  """Mines, writes the dataset and the JSON lines, prints the table."""
  try:
    config = SweConfig(source=source, branch=branch, max_commits=args.max_commits,
                       timeout=args.timeout, hypothesis_examples=args.hypothesis_examples,
                       workers=args.workers, test_fraction=args.test_fraction,
                       edit_format=args.edit_format, gold_runs=args.gold_runs,
                       repo_name=args.repo_name)
  except ValueError as e:
    raise BadInput(" ".join(str(e).split())) from e
  result = mine(config, cache_dir=args.cache_dir, progress=True)
  os.makedirs(args.out, exist_ok=True)
  dataset = "(none: no task)"
  if result.tasks:
    tfds.disable_progress_bar()
    logging.set_verbosity(logging.ERROR)
    builder = SweTasks(data_dir=args.out, swe=config, mined=result, cache_dir=args.cache_dir)
    with contextlib.redirect_stdout(sys.stderr):
      builder.download_and_prepare()
    dataset = builder.data_dir
  jsonl = os.path.join(args.out, export.FILE_NAME)
  export.write(jsonl, result.tasks)
  print(format_table(result.report, dataset, jsonl))
  return 0
