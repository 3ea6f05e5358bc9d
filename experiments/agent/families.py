"""Success per task family of agent_tiny runs: each seed's warm start and final policy.

    python -m experiments.agent.families OUT [--seeds 0 1 2] [--splits validation held_out]
        [--name agent_families] [--config.a.b=value ...]

OUT is an experiments/agent/tiny_seeds.py output directory (OUT/seed{S} holding a run's
workdir with its warm_start/). Each policy is scored as agent/tiny_seeds.py scores it
(experiments.lib.agent.evaluate_on: config.eval.num_samples episodes of every task of the
split), and the rows give eval/success and success per task family (the second
component of the task id: file, search, tests), and on tasks with a decoy line the
share of episodes that wrote the live constant and the decoy's (decoy/live,
decoy/decoy). Writes OUT/agent_families.json and results/agent/NAME.
"""

from __future__ import annotations

import argparse
import os

from experiments.lib import results, runs
from experiments.lib.agent import CONFIG, evaluate_on, split_tasks
from rlcode.config import loader
from rlcode.parallel import sharding


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--splits", nargs="+", default=["validation", "held_out"])
  parser.add_argument("--name", default="agent_families",
                      help="the result's name under results/agent/")
  args, overrides = parser.parse_known_args()
  found, first = {}, None
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    config = loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])
    first = config if first is None else first
    mesh = sharding.mesh_from_config(config.mesh)
    tasks = {split: split_tasks(config, split) for split in args.splits}  # read once a seed
    for arm, directory in (("warm_start", os.path.join(workdir, "warm_start")),
                           ("final", workdir)):
      model, tokenizer, _, _ = runs.restore_policy(config, directory, mesh)
      for split in args.splits:
        scores = evaluate_on(config, model, tokenizer, tasks[split], mesh)
        row = {k: v for k, v in scores.items()
               if k == "success" or k.startswith(("success/", "decoy/"))}
        found[f"{seed}/{arm}/{split}"] = row
        print(f"seed {seed} {arm:10s} {split:10s} "
              + "  ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
  results.write_json(found, os.path.join(args.out, "agent_families.json"))
  print("wrote", results.write("agent", args.name, found, config=first))


if __name__ == "__main__":
  main()
