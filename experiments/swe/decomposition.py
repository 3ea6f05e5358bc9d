"""Decomposition checked by tests: how many parts of a PR does some test distinguish?

For every executable PR task of each repository (rlcode.swe: mined, validated; the
miner's cache makes this read of them quick once `rlcode mine ... --tasks swe` ran), the
gold patch is cut into parts at "file" and "hunk" granularity; each part is withheld with
the rest of the PR applied, and the task's FAIL_TO_PASS tests run (rlcode.swe.decompose).
A part is checked when at least one of them then fails. Reports, per repository and
granularity: PR tasks, parts, checked parts (all, and among PRs of more than one part),
PRs whose every part is checked, and the distribution of parts per PR.

Command (from the repository root):

  python -m experiments.swe.decomposition
  python -m experiments.swe.decomposition --repos data/repos/attrs.bundle --workers 2
  python -m experiments.swe.decomposition --granularities file    # one granularity

Prints a table; writes results/swe/NAME (default decomposition): result.json (the
summaries, and every part with the number of FAIL_TO_PASS tests that fail without it)
and its manifest.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from experiments.lib import results, tables
from rlcode.swe import decompose, mining
from rlcode.swe.config import SweConfig
from rlcode.swe.runner import Runner

REPOS = ("data/repos/attrs.bundle", "data/repos/more-itertools.bundle")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repos", nargs="+", default=list(REPOS))
  parser.add_argument("--workers", type=int, default=0,
                      help="runs at once (default: the CPUs plus one)")
  parser.add_argument("--cache-dir", default=None,
                      help="the miner's cache (default ~/.cache/rlcode/swe)")
  parser.add_argument("--granularities", nargs="+", choices=decompose.GRANULARITIES,
                      default=list(decompose.GRANULARITIES))
  parser.add_argument("--name", default="decomposition")
  args = parser.parse_args(argv)
  cache = args.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "rlcode", "swe")
  runner = Runner(os.path.join(cache, "runs"))
  rows, payload = [], {"repos": {}}
  for repo in args.repos:
    config = SweConfig(source=repo, workers=args.workers)
    found = mining.mine(config, cache_dir=args.cache_dir, progress=True).tasks
    workers = mining.worker_count(config)
    payload["repos"][repo] = {}
    for granularity in args.granularities:
      start = time.monotonic()
      checked = decompose.check(found, granularity, runner, workers=workers, progress=True)
      summary = decompose.summary(checked)
      summary["seconds"] = round(time.monotonic() - start, 1)
      # A part's row keeps how many FAIL_TO_PASS tests fail without it, not their ids (the
      # ids are the task's, in its SWE-bench file; a rerun reads the runs from the cache).
      payload["repos"][repo][granularity] = {
          "summary": summary,
          "parts": [{**dataclasses.asdict(c), "makes_pass": len(c.makes_pass)} for c in checked]}
      bins = summary["parts_per_pr"]
      rows.append([os.path.basename(repo), granularity, summary["tasks"], summary["parts"],
                   f"{summary['checked']} ({summary['checked_share']:.0%})",
                   f"{summary['checked_in_multi_part']} / {summary['parts_in_multi_part']}",
                   summary["tasks_all_checked"],
                   " / ".join(str(bins[k]) for k in ("1", "2", "3-4", "5-8", "9+")),
                   summary["unfinished_runs"]])
  header = ["repository", "parts", "PR tasks", "parts", "checked",
            "checked in PRs of 2+ parts", "PRs all checked", "PRs of 1 / 2 / 3-4 / 5-8 / 9+ parts",
            "runs unfinished"]
  table = tables.markdown(header, rows, "llrrrrrlr")
  print(table)
  payload["table"] = table
  print(results.write("swe", args.name, payload))


if __name__ == "__main__":
  main()
