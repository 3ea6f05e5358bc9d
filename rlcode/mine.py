"""`rlcode mine SOURCE[@BRANCH] --out DIR [--granularity G ...]`: mine, store, count.

With `--tasks swe` the history is mined into executable PR tasks instead
(rlcode.swe.command: PRs whose own tests go from failing to passing).

Mines the history once (a progress bar on stderr while it walks), writes one
tfds dataset (GitDiffs) per granularity under DIR, and prints the counts:
first-parent commits walked, PRs kept and skipped by reason, units per
granularity, PRs and tasks per split, ending with the line
`units: pr=N commit=N file=N hunk=N`. Bad input (a path that is not a
repository, an unknown branch, a shallow or empty history, a corrupt bundle)
raises BadInput, which rlcode.cli prints as one line on stderr with exit status 2.

This module must not mine or decide anything itself: it parses, calls rlcode.data.git
(diff tasks) or rlcode.swe (executable tasks) and prints. It sits above both packages, so
neither imports the other.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Sequence

import tensorflow_datasets as tfds
from absl import logging

from rlcode.data import edits
from rlcode.data.git.builder import GitDiffs
from rlcode.data.git.config import GRANULARITIES, MiningConfig
from rlcode.data.git.mining import mine
from rlcode.errors import BadInput
from rlcode.swe import command as swe_command

TASK_KINDS = ("diffs", "swe")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("source", metavar="SOURCE[@BRANCH]",
                      help="a repository, or a git bundle (local or gs://); @BRANCH picks the "
                           "branch, tag or commit (default HEAD)")
  parser.add_argument("--out", required=True, help="tfds data_dir the datasets are written to")
  parser.add_argument("--tasks", choices=TASK_KINDS, default="diffs",
                      help="diffs: diff tasks scored against the real change (default); swe: "
                           "executable PR tasks checked by the repository's own tests")
  parser.add_argument("--granularity", action="append", choices=GRANULARITIES,
                      help="a dataset per granularity given (repeat; default: all four)")
  parser.add_argument("--languages", action="append", default=[],
                      help="keep only these languages or extensions (repeat; default: all)")
  parser.add_argument("--max-commits", type=int, default=0,
                      help="walk only the latest N first-parent commits (default: all)")
  parser.add_argument("--test-fraction", type=float, default=0.1,
                      help="the latest fraction of PRs held out (default 0.1)")
  parser.add_argument("--validation-fraction", type=float, default=0.0,
                      help="this fraction of PRs, the latest before the test split, form a "
                           "validation split (default 0: none)")
  parser.add_argument("--context-lines", type=int, default=0,
                      help="prompts show the lines within N of each change (default: whole)")
  parser.add_argument("--edit-format", choices=edits.EDIT_FORMATS, default=None,
                      help="the answer format prompts ask for and references use "
                           "(default search_replace; unified_diff with --tasks swe; "
                           "rlcode.data.edits)")
  swe_command.add_arguments(parser)


def split_source(spec: str) -> tuple[str, str]:
  """SOURCE[@BRANCH] -> (source, branch); an existing path containing "@" is a source."""
  if "@" not in spec or os.path.exists(spec):
    return spec, "HEAD"
  source, _, branch = spec.rpartition("@")
  return source, branch or "HEAD"


def format_table(report: dict, datasets: dict[str, str]) -> str:
  """The counts of a mining report, one row each; the last row is the `units:` line."""
  rows = [("source", f"{report['source']} @ {report['branch']} ({report['head'][:12]})"),
          ("walked (first-parent commits)", report["commits_total"]),
          ("kept (PRs)", report["commits_kept"]),
          ("  merged PRs / single commits",
           f"{report['prs']['merge']} / {report['prs']['single_commit']}"),
          ("skipped", sum(report["commits_skipped"].values()))]
  rows += [(f"  {reason}", n) for reason, n in report["commits_skipped"].items()]
  rows += [("files cut to windows", report["files_cut"])]
  rows += [(f"units: {g}", report["units"][g]) for g in GRANULARITIES]
  names = list(next(iter(report["tasks_by_granularity"].values())))
  split = report["split"]
  rows += [(f"{' / '.join(names)} PRs", " / ".join(str(split[f"{n}_commits"]) for n in names))]
  for g, counts in report["tasks_by_granularity"].items():
    rows.append((f"{g} tasks: {' / '.join(names)}", " / ".join(str(counts[n]) for n in names)))
    rows.append((f"{g} dataset", datasets[g]))
  width = max(len(name) for name, _ in rows)
  lines = [f"{name.ljust(width)}  {value}" for name, value in rows]
  lines.append("units: " + " ".join(f"{g}={report['units'][g]}" for g in GRANULARITIES))
  return "\n".join(lines)


# Options of diff mining that executable PR tasks do not read, with their defaults.
_DIFFS_ONLY = {"granularity": None, "languages": [], "validation_fraction": 0.0,
               "context_lines": 0}


def run(args: argparse.Namespace) -> int:
  """Mines, writes the datasets and prints the table.

  Raises BadInput (a UserError: one line and exit 2 from the CLI) for a source that is
  not a repository or bundle, an unknown branch, a shallow or empty history, or
  options MiningConfig refuses.
  """
  source, branch = split_source(args.source)
  if args.tasks == "swe":
    given = [k for k, default in _DIFFS_ONLY.items() if getattr(args, k) != default]
    if given:
      raise BadInput(f"--{given[0].replace('_', '-')} is for --tasks diffs; --tasks swe "
                     "mines whole PRs")
    args.edit_format = args.edit_format or "unified_diff"
    return swe_command.run(args, source, branch)
  args.edit_format = args.edit_format or "search_replace"
  given = [k for k, default in swe_command.DEFAULTS.items() if getattr(args, k) != default]
  if given:
    raise BadInput(f"--{given[0].replace('_', '-')} is for --tasks swe")
  granularities = list(dict.fromkeys(args.granularity or GRANULARITIES))
  try:
    config = MiningConfig(source=source, branch=branch, granularity=granularities[0],
                          languages=tuple(args.languages), max_commits=args.max_commits,
                          test_fraction=args.test_fraction,
                          validation_fraction=args.validation_fraction,
                          context_lines=args.context_lines, edit_format=args.edit_format)
  except ValueError as e:
    raise BadInput(" ".join(str(e).split())) from e
  result = mine(config, granularities=granularities, progress=True)
  tfds.disable_progress_bar()
  # tfds warns that every GitDiffs config is custom, and prints its progress
  # to stdout; stdout is for the table.
  logging.set_verbosity(logging.ERROR)
  datasets = {}
  for g in granularities:
    builder = GitDiffs(data_dir=args.out, mining=dataclasses.replace(config, granularity=g),
                       mined=result)
    with contextlib.redirect_stdout(sys.stderr):
      builder.download_and_prepare()
    datasets[g] = builder.data_dir
  print(format_table(result.report, datasets))
  return 0


def main(argv: Sequence[str], parser_class=argparse.ArgumentParser) -> int:
  """`rlcode mine ARGS`: the exit status (rlcode.cli passes its one-line-error parser)."""
  parser = parser_class(prog="rlcode mine", description=__doc__.splitlines()[0])
  add_arguments(parser)
  return run(parser.parse_args(argv))
