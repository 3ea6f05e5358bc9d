"""GRPO with a learned reward (a reward model of user choices) against GRPO with the tests.

For each seed, both arms start from the same warm start (configs/grpo_tiny.py; the warm
start depends only on the seed) and train the same schedule; they differ only in the
reward: "tests" (configs/grpo_tiny.py: the task's tests in the sandbox) or "rm"
(configs/grpo_rm.py: the score of the reward model at --rm, trained by `rlcode train
--config configs/rm_choices.py` on simulated choices among the warm-started policy's
candidates). The periodic eval rows are on the validation split (pass@1 by the tests);
the held-out split is read once per arm and scores its final policy and the warm start.

    python -m experiments.grpo.rm_reward --rm RM_WORKDIR [--seeds 0 1 2] [--arms tests rm]
        [--out experiments/out/grpo_rm] [--name grpo_rm] [--config.a.b=value ...]

A workdir that already holds a finished run is reused (re-running `rlcode train` on it
resumes at its last step). Prints a table with mean ± standard error over seeds, wall-clock
and load; grpo_rm.json stays under --out (rewritten as arms finish) and goes to
results/grpo/NAME/.
"""

from __future__ import annotations

import argparse
import os

from experiments.lib import ROOT, heldout, results, runs, stats
from rlcode.config import loader
from rlcode.parallel import sharding

CONFIGS = {"tests": "configs/grpo_tiny.py:references", "rm": "configs/grpo_rm.py"}
NAN = float("nan")


def arm_args(arm, seed, workdir, rm, overrides):
  """The overrides of one arm's run."""
  extra = [f"--config.reward_options.rm.checkpoint={rm}"] if arm == "rm" else []
  return [f"--config.seed={seed}", f"--config.workdir={workdir}", *extra, *overrides]


def arm_config(arm, seed, rm, overrides, workdir):
  """The arm's config."""
  return loader.load_config(os.path.join(ROOT, CONFIGS[arm]),
                            arm_args(arm, seed, workdir, rm, overrides))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--arms", nargs="+", default=["tests", "rm"], choices=list(CONFIGS))
  parser.add_argument("--rm", default="experiments/out/rm_choices")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments/out/grpo_rm"))
  parser.add_argument("--name", default="grpo_rm", help="the result's name under results/grpo/")
  args, overrides = parser.parse_known_args()
  os.makedirs(args.out, exist_ok=True)
  found, first = [], None
  for seed in args.seeds:
    for arm in args.arms:
      workdir = os.path.join(args.out, f"{arm}_seed{seed}")
      run = runs.train_process(CONFIGS[arm], ["--config.train.progress_bar=false",
                                              *arm_args(arm, seed, workdir, args.rm, overrides)],
                               workdir)
      evals = runs.eval_rows(run["rows"], "eval/pass@1")
      config = arm_config(arm, seed, args.rm, overrides, workdir)
      first = config if first is None else first
      mesh = sharding.mesh_from_config(config.mesh)
      # read once for the arm's two policies
      tasks = heldout.read(config, "held_out")[:config.data.max_eval_tasks]
      found.append({
          "seed": seed, "arm": arm, "minutes_this_call": run["minutes"],
          "train_minutes": runs.train_seconds(runs.step_rows(run["rows"])) / 60,
          "val_steps": [r["step"] for r in evals],
          "val_pass@1": [r["eval/pass@1"] for r in evals],
          "held_out_warm_start": runs.restored_pass_at_1(
              config, os.path.join(workdir, "warm_start"), tasks, mesh),
          "held_out": runs.restored_pass_at_1(config, workdir, tasks, mesh),
          "load_before": run["load_before"], "load_after": os.getloadavg()})
      results.write_json({"runs": found, "overrides": overrides},
                         os.path.join(args.out, "grpo_rm.json"))

  print(f"{'seed':>4s} {'arm':>5s} {'val first':>9s} {'val last':>8s} {'held warm':>9s} "
        f"{'held last':>9s} {'train min':>9s}  load before -> after")
  for r in found:
    print(f"{r['seed']:4d} {r['arm']:>5s} {r['val_pass@1'][0]:9.3f} {r['val_pass@1'][-1]:8.3f} "
          f"{r['held_out_warm_start']:9.3f} {r['held_out']:9.3f} {r['train_minutes']:9.1f}  "
          f"{r['load_before']} -> {r['load_after']}")
  summary = {}
  for arm in args.arms:
    per = [r for r in found if r["arm"] == arm]
    summary[arm] = {"held_out": stats.mean_se([r["held_out"] for r in per], se_of_one=NAN),
                    "gain": stats.paired([r["held_out"] for r in per],
                                         [r["held_out_warm_start"] for r in per],
                                         se_of_one=NAN),
                    "seeds": [r["seed"] for r in per]}
    m, se = summary[arm]["held_out"]
    g, gse = summary[arm]["gain"]
    print(f"{arm}: held-out pass@1 {m:.3f} ± {se:.3f}, gain over the warm start {g:+.3f} ± "
          f"{gse:.3f} (mean ± standard error over {len(per)} seed(s))")
  payload = {"runs": found, "summary": summary, "overrides": overrides}
  results.write_json(payload, os.path.join(args.out, "grpo_rm.json"))
  print("wrote", results.write("grpo", args.name, payload, config=first))


if __name__ == "__main__":
  main()
