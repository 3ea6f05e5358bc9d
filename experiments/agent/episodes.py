"""Print an agent policy's episodes as text, to read what it does.

    python -m experiments.agent.episodes POLICY [--split validation] [--tasks REGEX]
        [--max-tasks 12] [--samples 4] [--temperature 1.0] [--failures-only]
        [--config.a.b=value ...]

POLICY is a run's workdir or its warm_start/ directory (configs/agent_tiny.py, with the
given overrides, must describe its model). For each selected task of the split
(task ids matching --tasks), --samples episodes are sampled as the evaluation samples
them, and each episode is printed whole (turns, tool calls and observations, decoded
from the exact tokens) with its task id, reward and end status. The last line counts
episodes by (success, status).

Writes nothing. The tests-family diagnostic in docs/journal.md (agent_tiny) is

    python -m experiments.agent.episodes OUT/seed1/warm_start --tasks '^agent/tests/' \\
        --config.seed=1 --failures-only
"""

from __future__ import annotations

import argparse
import collections
import re

from experiments.lib import agent as agent_lib, runs
from experiments.lib.agent import CONFIG, split_tasks
from rlcode.agent import episodes, sampler
from rlcode.config import loader
from rlcode.parallel import sharding


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("policy")
  parser.add_argument("--split", default="validation")
  parser.add_argument("--tasks", default="", help="regular expression on task ids")
  parser.add_argument("--max-tasks", type=int, default=12)
  parser.add_argument("--samples", type=int, default=4)
  parser.add_argument("--temperature", type=float, default=1.0)
  parser.add_argument("--seed", type=int, default=11, help="sampling seed")
  parser.add_argument("--failures-only", action="store_true")
  args, overrides = parser.parse_known_args()
  config = loader.load_config(CONFIG, overrides)
  mesh = sharding.mesh_from_config(config.mesh)
  model, tokenizer, _, _ = runs.restore_policy(config, args.policy, mesh)
  pattern = re.compile(args.tasks)
  tasks = [t for t in split_tasks(config, args.split) if pattern.search(t.id)][:args.max_tasks]
  if not tasks:
    raise SystemExit(f"--tasks {args.tasks!r}: no task of the {args.split} split matches")
  chat = episodes.chat_format(config.agent, tokenizer)
  envs = agent_lib.make_envs(config, len(tasks) * args.samples,
                             embed=episodes.embedder(config.agent))
  try:
    trajs = sampler.run_episodes(model, chat, envs, tasks, group_size=args.samples,
                                 budgets=episodes.budgets(config.agent),
                                 temperature=args.temperature, seed=args.seed, mesh=mesh,
                                 workers=config.agent.workers)
  finally:
    for env in envs:
      env.close()
  counts = collections.Counter()
  for t in trajs:
    success = t.reward >= config.agent.success_reward
    counts[(success, t.status)] += 1
    if args.failures_only and success:
      continue
    print("=" * 20, t.task.id, f"reward {t.reward:.2f}", t.status)
    print(tokenizer.decode(t.tokens))
  print({f"{'success' if s else 'failure'}/{status}": n
         for (s, status), n in sorted(counts.items())})


if __name__ == "__main__":
  main()
