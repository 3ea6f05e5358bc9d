"""The default job's RL gain, averaged over seeds.

Runs `rlcode train --config configs/grpo_tiny.py` with seeds 0, 1 and 2 (each in
its own workdir, one after another), and compares held-out pass@1 in the first
eval row (right after the supervised warm start, before any GRPO update) with the
last eval row.

    python experiments/grpo_tiny_seeds.py [--seeds 0 1 2] [--out experiments/out/grpo_tiny_seeds]

Prints a table, writes grpo_tiny_seeds.json and grpo_tiny_seeds.png (pass@1
against step, one line per seed) under --out. Extra arguments of the form
--config.a.b=value are passed to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlcode.metrics import read_metrics  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/grpo_tiny_seeds"))
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  runs = []
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    cmd = [sys.executable, "-m", "rlcode", "train", "--config", "configs/grpo_tiny.py",
           f"--config.seed={seed}", f"--config.workdir={workdir}",
           "--config.train.progress_bar=false", *overrides]
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    evals = [r for r in read_metrics(workdir) if "eval/pass@1" in r]
    runs.append({"seed": seed, "minutes": (time.time() - start) / 60,
                 "steps": [r["step"] for r in evals],
                 "pass@1": [r["eval/pass@1"] for r in evals]})

  print(f"{'seed':>4s} {'first pass@1':>13s} {'last pass@1':>12s} {'gain':>7s} {'minutes':>8s}")
  for r in runs:
    r["gain"] = r["pass@1"][-1] - r["pass@1"][0]
    print(f"{r['seed']:4d} {r['pass@1'][0]:13.3f} {r['pass@1'][-1]:12.3f} {r['gain']:+7.3f} "
          f"{r['minutes']:8.1f}")
  mean = lambda xs: sum(xs) / len(xs)
  summary = {"first": mean([r["pass@1"][0] for r in runs]),
             "last": mean([r["pass@1"][-1] for r in runs]),
             "gain": mean([r["gain"] for r in runs])}
  print(f"mean {summary['first']:13.3f} {summary['last']:12.3f} {summary['gain']:+7.3f}")
  with open(os.path.join(args.out, "grpo_tiny_seeds.json"), "w") as f:
    json.dump({"runs": runs, "mean": summary, "overrides": overrides}, f, indent=2)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in runs:
    ax.plot(r["steps"], r["pass@1"], marker="o", label=f"seed {r['seed']}")
  ax.set_xlabel("GRPO step")
  ax.set_ylabel("held-out pass@1")
  ax.set_title(f"grpo_tiny: mean gain {summary['gain']:+.3f}")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "grpo_tiny_seeds.png"), dpi=110)


if __name__ == "__main__":
  main()
