"""The default job's RL gain over seeds, against a cross-entropy control, held out once.

For each seed:
1. GRPO: `rlcode train --config configs/grpo_tiny.py --config.seed=S` in its own
   workdir (a fresh process). Its periodic eval rows are on the validation split
   (the one hyperparameters were tuned on).
2. Cross-entropy control: from the same warm-started policy (WORKDIR/warm_start),
   supervised steps on the training split's reference solutions for as much
   training time as the GRPO phase spent (rollout + reward + update seconds), at
   the GRPO optimizer's learning rate held constant.
3. The held-out split, read once: pass@1 of the warm-started policy, of the GRPO
   policy and of the control (config.eval: EVAL_SAMPLES samples per problem at the
   rollout temperature, unbiased pass@1).

    python -m experiments.grpo.tiny_seeds [--seeds 0 1 2] [--arms grpo ce] [--no-held-out]
        [--out experiments/out/grpo_tiny_seeds] [--name grpo_tiny_seeds]
        [--config.a.b=value ...]

    python -m experiments.grpo.tiny_seeds --combine OUT1/grpo_tiny_seeds.json ... --name N

--combine makes one result of seeds that ran as separate processes side by side (each with
one --seeds and its own --out): their runs are read, nothing is run again.
--no-held-out with --arms grpo is the tuning mode (validation only). Prints a table
with mean and standard error over seeds. The runs and grpo_tiny_seeds.json (rewritten
as seeds finish) stay under --out; the result (the same JSON and grpo_tiny_seeds.png,
validation pass@1 against step, one line per seed) goes to results/grpo/NAME/.
Extra --config.a.b=value arguments go to every run.
"""

from __future__ import annotations

import argparse
import json
import os

from flax import nnx

from experiments.lib import ROOT, results, runs, stats
from rlcode.config import loader
from rlcode.data import sources
from rlcode.evaluation import policy_eval
from rlcode.parallel import sharding
from rlcode.train import sft

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny.py")
NAN = float("nan")


def load(seed, overrides, split=None):
  """configs/grpo_tiny.py with the seed and overrides (and another eval split)."""
  extra = [] if split is None else [f"--config.data.eval_split={split}"]
  return loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides, *extra])


def grpo_arm(seed, workdir, overrides):
  """The GRPO run in a fresh process: its minutes, training seconds and validation curve."""
  run = runs.train_process(CONFIG, [f"--config.seed={seed}", f"--config.workdir={workdir}",
                                    "--config.train.progress_bar=false", *overrides], workdir)
  evals = runs.eval_rows(run["rows"], "eval/pass@1")
  steps = runs.step_rows(run["rows"])
  rewards = [r["reward_mean"] for r in steps]
  return {"minutes": run["minutes"],
          "train_seconds": runs.train_seconds(steps),
          # The rollouts' mean reward over the first and the last ten steps.
          "reward_first10": sum(rewards[:10]) / len(rewards[:10]),
          "reward_last10": sum(rewards[-10:]) / len(rewards[-10:]),
          "val_steps": [r["step"] for r in evals],
          "val_pass@1": [r["eval/pass@1"] for r in evals]}


def control_arm(config, workdir, seconds, mesh):
  """Cross-entropy from the run's warm start for `seconds` of training: (policy, stats)."""
  model, tokenizer, _, _ = policy_eval.restore_policy(config, os.path.join(workdir, "warm_start"),
                                                      mesh)
  graphdef, params = nnx.split(model, nnx.Param)
  params, stats_ = sft.run(graphdef, params, sources.load(config.data, config.data.train_split),
                           tokenizer, mesh, optimizer=runs.constant_lr(config.optimizer),
                           batch_size=config.warmstart.batch_size, seed=config.seed + 2,
                           seconds=seconds)
  return nnx.merge(graphdef, params), tokenizer, stats_


def _combined(paths):
  """(runs, overrides) of several progress files; their overrides must agree."""
  runs_, overrides = [], None
  for path in paths:
    with open(path) as f:
      part = json.load(f)
    if overrides is not None and part["overrides"] != overrides:
      raise SystemExit(f"{path}: overrides {part['overrides']} differ from {overrides}")
    overrides = part["overrides"]
    runs_ += part["runs"]
  return sorted(runs_, key=lambda r: r["seed"]), overrides


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=["grpo", "ce"], choices=["grpo", "ce"])
  parser.add_argument("--no-held-out", action="store_true",
                      help="tuning mode: report the validation split only")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/grpo_tiny_seeds"))
  parser.add_argument("--name", default="grpo_tiny_seeds",
                      help="the result's name under results/grpo/")
  parser.add_argument("--combine", nargs="+", default=[], metavar="JSON",
                      help="the grpo_tiny_seeds.json of runs made apart: one result of them")
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  progress = os.path.join(args.out, "grpo_tiny_seeds.json")
  found = []
  if args.combine:
    found, overrides = _combined(args.combine)
    args.seeds = [r["seed"] for r in found]
    args.arms = ["grpo", "ce"] if all("ce" in r for r in found) else ["grpo"]
    args.no_held_out = not all("held_out" in r for r in found)
  for seed in [] if args.combine else args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    run = {"seed": seed, **grpo_arm(seed, workdir, overrides)}
    config = load(seed, overrides)
    mesh = sharding.mesh_from_config(config.mesh)
    if not args.no_held_out:
      held = load(seed, overrides, "held_out")
      held_tasks = sources.load_eval(held.data)  # read once for the run's three policies
      run["held_out"] = {
          "warm_start": runs.restored_pass_at_1(held, os.path.join(workdir, "warm_start"),
                                                held_tasks, mesh),
          "grpo": runs.restored_pass_at_1(held, workdir, held_tasks, mesh)}
    if "ce" in args.arms:
      policy, tokenizer, ce = control_arm(config, workdir, run["train_seconds"], mesh)
      ce["val_pass@1"] = runs.pass_at_1(config, policy, tokenizer,
                                        sources.load_eval(config.data), mesh)
      if not args.no_held_out:
        run["held_out"]["ce"] = runs.pass_at_1(held, policy, tokenizer, held_tasks, mesh)
      run["ce"] = ce
    found.append(run)
    results.write_json({"runs": found, "overrides": overrides}, progress)

  print(f"{'seed':>4s} {'val first':>9s} {'val last':>8s} {'val gain':>8s}"
        + ("" if args.no_held_out else
           f" {'held warm':>9s} {'held grpo':>9s} {'held ce':>7s}") + f" {'minutes':>7s}")
  for r in found:
    r["val_gain"] = r["val_pass@1"][-1] - r["val_pass@1"][0]
    line = f"{r['seed']:4d} {r['val_pass@1'][0]:9.3f} {r['val_pass@1'][-1]:8.3f} {r['val_gain']:+8.3f}"
    if not args.no_held_out:
      h = r["held_out"]
      line += f" {h['warm_start']:9.3f} {h['grpo']:9.3f} {h.get('ce', NAN):7.3f}"
    print(line + f" {r['minutes']:7.1f}")
  summary = {"val_gain": stats.mean_se([r["val_gain"] for r in found], se_of_one=NAN)}
  if not args.no_held_out:
    held_of = lambda arm: [r["held_out"][arm] for r in found]
    summary["held_out_grpo_gain"] = stats.paired(held_of("grpo"), held_of("warm_start"),
                                                 se_of_one=NAN)
    if "ce" in args.arms:
      summary["held_out_ce_gain"] = stats.paired(held_of("ce"), held_of("warm_start"),
                                                 se_of_one=NAN)
      summary["held_out_grpo_minus_ce"] = stats.paired(held_of("grpo"), held_of("ce"),
                                                       se_of_one=NAN)
  for name, (m, se) in summary.items():
    print(f"{name}: {m:+.3f} ± {se:.3f} (mean ± standard error over {len(found)} seeds)")
  payload = {"runs": found, "summary": summary, "overrides": overrides}
  results.write_json(payload, progress)

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in found:
    ax.plot(r["val_steps"], r["val_pass@1"], marker="o", label=f"seed {r['seed']}")
  ax.set_xlabel("GRPO step")
  ax.set_ylabel("validation pass@1")
  m, se = summary["val_gain"]
  ax.set_title(f"grpo_tiny: validation gain {m:+.3f} ± {se:.3f}")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  png = os.path.join(results.folder("grpo", args.name), "grpo_tiny_seeds.png")
  fig.savefig(png, dpi=110)
  print("wrote", results.write("grpo", args.name, payload,
                               config=load(args.seeds[0], overrides), files=[png]))


if __name__ == "__main__":
  main()
