"""Mines real git histories and tabulates kept and skipped commits by reason.

Command (from the repository root; each --source may take @BRANCH):

  python experiments/mine_git_history.py --source /work/main@main \
      --source /work/main@kernels --source /root/.pyenv

Prints one column per source (commits walked, kept, skipped by reason, units
per granularity, train/test tasks) and writes every build report to
experiments/out/mine_git_history.json. Nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import os

from rlcode.data.git import MiningConfig, mine


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--source", action="append", required=True,
                      help="PATH or PATH@BRANCH; repeat for several")
  parser.add_argument("--granularity", default="commit",
                      choices=("commit", "file", "hunk"))
  parser.add_argument("--edit_format", default="search_replace",
                      choices=("search_replace", "unified_diff"))
  parser.add_argument("--max_files", type=int, default=8)
  parser.add_argument("--max_changed_lines", type=int, default=400)
  parser.add_argument("--test_fraction", type=float, default=0.1)
  parser.add_argument("--out", default="experiments/out/mine_git_history.json")
  args = parser.parse_args(argv)

  reports = {}
  for spec in args.source:
    path, _, branch = spec.partition("@")
    config = MiningConfig(source=path, branch=branch or "HEAD",
                          granularity=args.granularity,
                          edit_format=args.edit_format,
                          max_files=args.max_files,
                          max_changed_lines=args.max_changed_lines,
                          test_fraction=args.test_fraction)
    reports[spec] = mine(config).report

  rows = [("commits walked", lambda r: r["commits_total"]),
          ("kept", lambda r: r["commits_kept"])]
  reasons = sorted({k for r in reports.values() for k in r["commits_skipped"]})
  rows += [(f"skipped: {k}", lambda r, k=k: r["commits_skipped"].get(k, 0))
           for k in reasons]
  rows += [(f"units: {g}", lambda r, g=g: r["units"][g])
           for g in ("commit", "file", "hunk")]
  rows += [(f"tasks: {s}", lambda r, s=s: r["tasks"][s])
           for s in ("train", "test")]
  rows += [("shallow", lambda r: r["shallow"])]
  names = list(reports)
  width = max(len(n) for n, _ in rows)
  cols = [max(len(s), 6) for s in names]
  print(" " * width + " | " + " | ".join(s.rjust(c) for s, c in zip(names, cols)))
  for name, get in rows:
    print(name.ljust(width) + " | " + " | ".join(
        str(get(reports[s])).rjust(c) for s, c in zip(names, cols)))
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(reports, f, indent=2, sort_keys=True)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
