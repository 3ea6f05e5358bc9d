"""`make smoke`'s wall clock: this tree cold and warm against an earlier commit, side by side.

    python -m experiments.speed.smoke [--baseline-commit eb2c18f] [--rounds 2]

Each round runs `make smoke`'s command (`rlcode train --config configs/grpo_tiny.py:smoke`,
a fresh workdir) three times, one after another:
  baseline   the earlier commit, from a detached git worktree under --out (made once),
             run by this environment's Python with the worktree first on its path
  cold       this tree with an empty persistent compilation cache (every program compiles)
  warm       this tree again on the cache the cold run filled (what a second `make smoke`
             on the same machine costs)
The datasets are prepared before the first round, so no arm pays for that. Every arm's
metrics rows are compared, times aside: cold and warm must log the same numbers.

Writes results/speed/smoke/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from experiments.lib import ROOT, results
from experiments.lib.trees import baseline_tree

COMMAND = ["-m", "rlcode", "train", "--config", "configs/grpo_tiny.py:smoke"]


def run(tree: str, env: dict, log: str) -> tuple[float, list[dict]]:
  """Seconds of one smoke run in `tree`, and its metrics rows without their timings."""
  workdir = os.path.join(tree, "workdirs", "smoke")
  shutil.rmtree(workdir, ignore_errors=True)
  start = time.perf_counter()
  with open(log, "w") as f:
    subprocess.run([sys.executable, *COMMAND], cwd=tree, env=env, stdout=f,
                   stderr=subprocess.STDOUT, check=True)
  seconds = time.perf_counter() - start
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  timing = lambda k: k.endswith("_seconds") or k.endswith("_per_s")
  return seconds, [{k: v for k, v in r.items() if not timing(k)} for r in rows]


def prepare() -> None:
  """The smoke config's dataset, prepared on disk (tfds builds every split at once) before
  anything is timed; only its training split is read."""
  from rlcode.config import loader
  from rlcode.data import sources
  config = loader.resolve(loader.load_config(os.path.join(ROOT, "configs", "grpo_tiny.py:smoke")))
  sources.load(config.data, config.data.train_split)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--baseline-commit", default="eb2c18f")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "out", "smoke"))
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  base = os.path.join(args.out, "baseline_tree")
  base_sha = baseline_tree(args.baseline_commit, base)
  prepare()
  times = {"baseline": [], "cold": [], "warm": []}
  same = True
  for r in range(args.rounds):
    cache = tempfile.mkdtemp(prefix="smoke-jax-cache-")
    try:
      for arm, tree in (("baseline", base), ("cold", ROOT), ("warm", ROOT)):
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="" if arm == "baseline" else cache,
                   PYTHONPATH=tree)
        seconds, rows = run(tree, env, os.path.join(args.out, f"{arm}_{r}.log"))
        times[arm].append(seconds)
        if arm == "cold":
          cold_rows = rows
        elif arm == "warm":
          same = same and rows == cold_rows
        print(f"round {r} {arm}: {seconds:.1f} s", flush=True)
    finally:
      shutil.rmtree(cache, ignore_errors=True)
  median = {arm: statistics.median(t) for arm, t in times.items()}
  payload = {
      "baseline_commit": base_sha, "rounds": args.rounds, "seconds": times,
      "median_seconds": median,
      "cold_over_baseline": median["cold"] / median["baseline"],
      "warm_over_baseline": median["warm"] / median["baseline"],
      "warm_logs_the_cold_runs_numbers": same}
  print(json.dumps(payload, indent=1))
  results.write("speed", "smoke", payload)


if __name__ == "__main__":
  main()
