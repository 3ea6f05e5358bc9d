"""Terminal only vs the richer tools, same budget: success and context tokens used.

Two arms of configs/agent_tiny.py (with the settings before the stale notes,
agent_tiny_seeds.PLAIN) on the tasks a terminal can solve (the file and
search variants of data/agent_tasks.jsonl; the tests variant needs run_tests):
  rich      editor, search, run_tests, finish; experts view/search, create, finish.
  terminal  bash, finish; experts `cat FILE` or `grep -rn SYMBOL .`, a heredoc into
            solution.py, finish.
Same budgets (turns, tokens), same steps and hyperparameters (tuned on the default
config's validation split, not per arm). Each arm trains from scratch (warm start
on its own experts, then GRPO); the table reports the held-out split once, at the
end: success, context tokens and tool calls per episode, and the warm start's.

    python experiments/agent_tools.py [--seeds 0] [--warm-start-only] [--config.a.b=value ...]

--warm-start-only stops each arm after its warm start (no GRPO steps) and compares
the warm starts, at the same number of supervised steps.

Writes experiments/out/agent_tools/agent_tools.json.
"""

from __future__ import annotations

import argparse
import json
import os

from agent_tiny_seeds import PLAIN, ROOT, held_out, load, mean_se, run_arm
from rlcode.parallel import sharding

ARMS = {
    "rich": ["--config.agent.tools=('editor','search','run_tests','finish')",
             "--config.agent.toolset=rich"],
    "terminal": ["--config.agent.tools=('bash','finish')", "--config.agent.toolset=terminal"],
}
COMMON = ["--config.agent.variants=('file','search')"]


def study(arms, description, out_name):
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--out", default=os.path.join(ROOT, f"experiments/out/{out_name}"))
  parser.add_argument("--warm-start-only", action="store_true",
                      help="no GRPO steps: compare the arms' warm starts (same budget)")
  args, overrides = parser.parse_known_args()
  overrides = [*PLAIN, *overrides]  # the settings these tables were made with
  if args.warm_start_only:
    overrides = [*overrides, "--config.train.steps=0"]
  os.makedirs(args.out, exist_ok=True)
  results = {}
  for name, arm in arms.items():
    results[name] = []
    for seed in args.seeds:
      workdir = os.path.join(args.out, f"{name}_seed{seed}")
      extra = [*arm, *overrides]
      run = run_arm(seed, workdir, extra)
      config = load(seed, extra)
      mesh = sharding.mesh_from_config(config.mesh)
      warm = held_out(config, os.path.join(workdir, "warm_start"), mesh)
      run["held_out"] = {"warm_start": warm,
                         "final": warm if args.warm_start_only else held_out(config, workdir,
                                                                             mesh)}
      results[name].append(run)
      with open(os.path.join(args.out, f"{out_name}.json"), "w") as f:
        json.dump({"results": results, "overrides": overrides}, f, indent=2)
  print("| arm | held-out success (warm start -> final) | context tokens / episode | "
        "tool calls / episode | minutes | load |")
  print("|---|---:|---:|---:|---:|---:|")
  for name, runs in results.items():
    h = lambda key, arm="final": mean_se([r["held_out"][arm][key] for r in runs])
    (w, _), (s, se) = h("success", "warm_start"), h("success")
    print(f"| {name} | {w:.3f} -> {s:.3f} ± {se:.3f} | {h('context_tokens')[0]:.0f} | "
          f"{h('tool_calls_per_episode')[0]:.2f} | "
          f"{sum(r['minutes'] for r in runs) / len(runs):.1f} | "
          f"{min(r['load'][0] for r in runs):.1f}-{max(r['load'][1] for r in runs):.1f} |")


if __name__ == "__main__":
  study({k: [*COMMON, *v] for k, v in ARMS.items()}, __doc__.splitlines()[0], "agent_tools")
