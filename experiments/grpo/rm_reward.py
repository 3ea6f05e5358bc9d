"""GRPO with a learned reward (a reward model of user choices) against GRPO with the tests.

For each seed, both arms start from the same warm start (configs/grpo_tiny.py; the warm
start depends only on the seed) and train the same schedule; they differ only in the
reward: "tests" (configs/grpo_tiny.py: the task's tests in the sandbox) or "rm"
(configs/grpo_rm.py: the score of the reward model at --rm, trained by `rlcode train-rm`
on simulated choices among the warm-started policy's candidates). The periodic eval rows
are on the validation split (pass@1 by the tests); the held-out split is evaluated once
per final policy and for the warm start.

    python experiments/grpo_rm.py --rm RM_WORKDIR [--seeds 0 1 2] [--arms tests rm]
        [--out experiments/out/grpo_rm] [--config.a.b=value ...]

A workdir that already holds a finished run is reused (re-running `rlcode train` on it
resumes at its last step). Prints a table with mean ± standard error over seeds, wall-clock
and load; writes grpo_rm.json under --out and --plots.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlcode.config import loader
from rlcode.parallel import sharding
from rlcode.evaluation import policy_eval  # noqa: E402
from rlcode.data import sources  # noqa: E402
from rlcode.runs.metrics import read_metrics  # noqa: E402

CONFIGS = {"tests": "configs/grpo_tiny.py", "rm": "configs/grpo_rm.py"}


def mean_se(xs):
  m = sum(xs) / len(xs)
  if len(xs) < 2:
    return m, float("nan")
  return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def arm_args(arm, seed, workdir, rm, overrides):
  extra = [f"--config.reward_options.rm.checkpoint={rm}"] if arm == "rm" else []
  return [f"--config.seed={seed}", f"--config.workdir={workdir}", *extra, *overrides]


def held_out(arm, seed, directory, rm, overrides, workdir):
  config = loader.load_config(os.path.join(ROOT, CONFIGS[arm]),
                                  [*arm_args(arm, seed, workdir, rm, overrides),
                                   "--config.data.eval_split=held_out"])
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, _, _ = policy_eval.restore_policy(config, directory, mesh)
  tasks = sources.load_eval(config.data)
  return policy_eval.held_out_eval(config, model, tokenizer, tasks, mesh, ks=(1,))["pass@1"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=["tests", "rm"], choices=list(CONFIGS))
  parser.add_argument("--rm", default="experiments/out/rm_choices")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/grpo_rm"))
  parser.add_argument("--plots", default=os.path.join(ROOT, "experiments/plots"))
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  runs = []
  for seed in args.seeds:
    for arm in args.arms:
      workdir = os.path.join(args.out, f"{arm}_seed{seed}")
      load_before, start = os.getloadavg(), time.time()
      subprocess.run([sys.executable, "-m", "rlcode", "train", "--config", CONFIGS[arm],
                      "--config.train.progress_bar=false",
                      *arm_args(arm, seed, workdir, args.rm, overrides)], cwd=ROOT, check=True)
      rows = read_metrics(workdir)
      evals = [r for r in rows if "eval/pass@1" in r]
      steps = [r for r in rows if "loss" in r]
      run = {"seed": seed, "arm": arm, "minutes_this_call": (time.time() - start) / 60,
             "train_minutes": sum(r["rollout_seconds"] + r["reward_seconds"]
                                  + r["update_seconds"] for r in steps) / 60,
             "val_steps": [r["step"] for r in evals],
             "val_pass@1": [r["eval/pass@1"] for r in evals],
             "held_out_warm_start": held_out(arm, seed, os.path.join(workdir, "warm_start"),
                                             args.rm, overrides, workdir),
             "held_out": held_out(arm, seed, workdir, args.rm, overrides, workdir),
             "load_before": load_before, "load_after": os.getloadavg()}
      runs.append(run)
      with open(os.path.join(args.out, "grpo_rm.json"), "w") as f:
        json.dump({"runs": runs, "overrides": overrides}, f, indent=2)

  print(f"{'seed':>4s} {'arm':>5s} {'val first':>9s} {'val last':>8s} {'held warm':>9s} "
        f"{'held last':>9s} {'train min':>9s}  load before -> after")
  for r in runs:
    print(f"{r['seed']:4d} {r['arm']:>5s} {r['val_pass@1'][0]:9.3f} {r['val_pass@1'][-1]:8.3f} "
          f"{r['held_out_warm_start']:9.3f} {r['held_out']:9.3f} {r['train_minutes']:9.1f}  "
          f"{r['load_before']} -> {r['load_after']}")
  summary = {}
  for arm in args.arms:
    per = [r for r in runs if r["arm"] == arm]
    summary[arm] = {"held_out": mean_se([r["held_out"] for r in per]),
                    "gain": mean_se([r["held_out"] - r["held_out_warm_start"] for r in per]),
                    "seeds": [r["seed"] for r in per]}
    m, se = summary[arm]["held_out"]
    g, gse = summary[arm]["gain"]
    print(f"{arm}: held-out pass@1 {m:.3f} ± {se:.3f}, gain over the warm start {g:+.3f} ± "
          f"{gse:.3f} (mean ± standard error over {len(per)} seed(s))")
  for where in (args.out, args.plots):
    with open(os.path.join(where, "grpo_rm.json"), "w") as f:
      json.dump({"runs": runs, "summary": summary, "overrides": overrides}, f, indent=2)


if __name__ == "__main__":
  main()
