"""The default job's RL gain over seeds, against a cross-entropy control, held out once.

For each seed:
1. GRPO: `rlcode train --config configs/grpo_tiny.py --config.seed=S` in its own
   workdir (a fresh process). Its periodic eval rows are on the validation split
   (the one hyperparameters were tuned on).
2. Cross-entropy control: from the same warm-started policy (WORKDIR/warm_start),
   supervised steps on the training split's reference solutions for as much
   training time as the GRPO phase spent (rollout + reward + update seconds), at
   the GRPO optimizer's learning rate held constant.
3. The held-out split, once: pass@1 of the warm-started policy, of the GRPO policy
   and of the control (config.eval: EVAL_SAMPLES samples per problem at the
   rollout temperature, unbiased pass@1).

    python experiments/grpo_tiny_seeds.py [--seeds 0 1 2] [--arms grpo ce] [--no-held-out]
        [--out experiments/out/grpo_tiny_seeds] [--config.a.b=value ...]

--no-held-out with --arms grpo is the tuning mode (validation only). Prints a table
with mean and standard error over seeds, writes grpo_tiny_seeds.json and
grpo_tiny_seeds.png (validation pass@1 against step, one line per seed) under --out.
Extra --config.a.b=value arguments go to every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlcode.config import loader
from rlcode.train import sft
from rlcode.parallel import sharding
from rlcode.evaluation import policy_eval
from rlcode import optim  # noqa: E402
from rlcode.data import sources  # noqa: E402
from rlcode.runs.metrics import read_metrics  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")


def mean_se(xs):
  m = sum(xs) / len(xs)
  if len(xs) < 2:
    return m, float("nan")
  var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
  return m, math.sqrt(var / len(xs))


def load(seed, overrides, split=None):
  extra = [] if split is None else [f"--config.data.eval_split={split}"]
  return loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides, *extra])


def pass1(config, policy, tokenizer, mesh):
  """pass@1 of a policy on the config's eval split."""
  tasks = sources.load_eval(config.data)
  return policy_eval.held_out_eval(config, policy, tokenizer, tasks, mesh, ks=(1,))["pass@1"]


def grpo_arm(seed, workdir, overrides):
  cmd = [sys.executable, "-m", "rlcode", "train", "--config", CONFIG, f"--config.seed={seed}",
         f"--config.workdir={workdir}", "--config.train.progress_bar=false", *overrides]
  start = time.time()
  subprocess.run(cmd, cwd=ROOT, check=True)
  rows = read_metrics(workdir)
  steps = [r for r in rows if "loss" in r]
  evals = [r for r in rows if "eval/pass@1" in r]
  return {"minutes": (time.time() - start) / 60,
          "train_seconds": sum(r["rollout_seconds"] + r["reward_seconds"] + r["update_seconds"]
                               for r in steps),
          "val_steps": [r["step"] for r in evals],
          "val_pass@1": [r["eval/pass@1"] for r in evals]}


def control_arm(config, workdir, seconds, mesh):
  """Cross-entropy from the run's warm start for `seconds` of training: (policy, stats)."""
  from flax import nnx
  model, tokenizer, _, _ = policy_eval.restore_policy(config, os.path.join(workdir, "warm_start"),
                                                   mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  opt = dataclasses.replace(optim.OptimizerConfig.from_config(config.optimizer),
                            end_lr_fraction=1.0)
  params, stats = sft.run(graphdef, params, sources.load(config.data, config.data.train_split),
                          tokenizer, mesh, optimizer=opt, batch_size=config.warmstart.batch_size,
                          seed=config.seed + 2, seconds=seconds)
  return nnx.merge(graphdef, params), tokenizer, stats


def held_out_of_checkpoint(seed, overrides, directory, mesh):
  config = load(seed, overrides, "held_out")
  model, tokenizer, _, _ = policy_eval.restore_policy(config, directory, mesh)
  return pass1(config, model, tokenizer, mesh)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=["grpo", "ce"], choices=["grpo", "ce"])
  parser.add_argument("--no-held-out", action="store_true",
                      help="tuning mode: report the validation split only")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/grpo_tiny_seeds"))
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  runs = []
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    run = {"seed": seed, **grpo_arm(seed, workdir, overrides)}
    mesh = sharding.mesh_from_config(load(seed, overrides).mesh)
    if not args.no_held_out:
      run["held_out"] = {
          "warm_start": held_out_of_checkpoint(seed, overrides,
                                               os.path.join(workdir, "warm_start"), mesh),
          "grpo": held_out_of_checkpoint(seed, overrides, workdir, mesh)}
    if "ce" in args.arms:
      policy, tokenizer, stats = control_arm(load(seed, overrides), workdir,
                                             run["train_seconds"], mesh)
      stats["val_pass@1"] = pass1(load(seed, overrides), policy, tokenizer, mesh)
      if not args.no_held_out:
        run["held_out"]["ce"] = pass1(load(seed, overrides, "held_out"), policy, tokenizer, mesh)
      run["ce"] = stats
    runs.append(run)
    with open(os.path.join(args.out, "grpo_tiny_seeds.json"), "w") as f:
      json.dump({"runs": runs, "overrides": overrides}, f, indent=2)

  print(f"{'seed':>4s} {'val first':>9s} {'val last':>8s} {'val gain':>8s}"
        + ("" if args.no_held_out else
           f" {'held warm':>9s} {'held grpo':>9s} {'held ce':>7s}") + f" {'minutes':>7s}")
  for r in runs:
    r["val_gain"] = r["val_pass@1"][-1] - r["val_pass@1"][0]
    line = f"{r['seed']:4d} {r['val_pass@1'][0]:9.3f} {r['val_pass@1'][-1]:8.3f} {r['val_gain']:+8.3f}"
    if not args.no_held_out:
      h = r["held_out"]
      line += f" {h['warm_start']:9.3f} {h['grpo']:9.3f} {h.get('ce', float('nan')):7.3f}"
    print(line + f" {r['minutes']:7.1f}")
  summary = {"val_gain": mean_se([r["val_gain"] for r in runs])}
  if not args.no_held_out:
    summary["held_out_grpo_gain"] = mean_se(
        [r["held_out"]["grpo"] - r["held_out"]["warm_start"] for r in runs])
    if "ce" in args.arms:
      summary["held_out_ce_gain"] = mean_se(
          [r["held_out"]["ce"] - r["held_out"]["warm_start"] for r in runs])
      summary["held_out_grpo_minus_ce"] = mean_se(
          [r["held_out"]["grpo"] - r["held_out"]["ce"] for r in runs])
  for name, (m, se) in summary.items():
    print(f"{name}: {m:+.3f} ± {se:.3f} (mean ± standard error over {len(runs)} seeds)")
  with open(os.path.join(args.out, "grpo_tiny_seeds.json"), "w") as f:
    json.dump({"runs": runs, "summary": summary, "overrides": overrides}, f, indent=2)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in runs:
    ax.plot(r["val_steps"], r["val_pass@1"], marker="o", label=f"seed {r['seed']}")
  ax.set_xlabel("GRPO step")
  ax.set_ylabel("validation pass@1")
  m, se = summary["val_gain"]
  ax.set_title(f"grpo_tiny: validation gain {m:+.3f} ± {se:.3f}")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "grpo_tiny_seeds.png"), dpi=110)


if __name__ == "__main__":
  main()
