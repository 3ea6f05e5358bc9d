"""Success per task family of agent_tiny runs: each seed's warm start and final policy.

    python experiments/agent_families.py OUT [--seeds 0 1 2] [--splits validation held_out]
        [--config.a.b=value ...]

OUT is an experiments/agent_tiny_seeds.py output directory (OUT/seed{S} holding a run's
workdir with its warm_start/). Each policy is scored as agent_tiny_seeds.py scores it
(rlcode.agent.train.evaluate_policy: config.eval.num_samples episodes of every task of the
split), and the rows give eval/success and success per task family (the second
component of the task id: file, search, tests), and on tasks with a decoy line the
share of episodes that wrote the live constant and the decoy's (decoy/live,
decoy/decoy). Writes OUT/agent_families.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from rlcode.config import loader
from rlcode.parallel import sharding  # noqa: E402
from rlcode.agent import evaluate  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "agent_tiny.py")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--splits", nargs="+", default=["validation", "held_out"])
  args, overrides = parser.parse_known_args()
  results = {}
  for seed in args.seeds:
    workdir = os.path.join(args.out, f"seed{seed}")
    config = loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])
    mesh = sharding.mesh_from_config(config.mesh)
    for arm, directory in (("warm_start", os.path.join(workdir, "warm_start")),
                           ("final", workdir)):
      model, tokenizer, _ = evaluate.restore_policy(config, directory, mesh)
      for split in args.splits:
        scores = evaluate.evaluate_policy(config, model, tokenizer, split, mesh)
        row = {k: v for k, v in scores.items()
               if k == "success" or k.startswith(("success/", "decoy/"))}
        results[f"{seed}/{arm}/{split}"] = row
        print(f"seed {seed} {arm:10s} {split:10s} "
              + "  ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
  with open(os.path.join(args.out, "agent_families.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
