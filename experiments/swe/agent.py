"""The agent on real repositories: the scripted gold agent, and the tiny policy's episodes.

1. The gold agent (rlcode.swe.workspace.gold_calls) plays every executable PR task of
   each repository through the tool environment: the repository at the base commit in a
   sandbox session, the gold patch applied through the editor (str_replace per hunk),
   finish; the reward is the task's tests on the workspace's diff (swe_tests, with the
   runner's cache: a tree the miner ran is read, not run again) and the diff reward.
   Reports the resolve rate, calls and seconds per episode.
2. The tiny policy: `rlcode train --config configs/agent_swe.py` (its steps, in a fresh
   process, workdir --out/policy), then the means of its step rows: success, tool calls,
   sampled and context tokens, and seconds per episode (a step's rollout seconds over its
   episodes). --skip-policy leaves it out.

Command (from the repository root):

  python -m experiments.swe.agent
  python -m experiments.swe.agent --max-tasks 20 --skip-policy

Prints a table; writes results/swe/NAME (default agent) with its manifest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time

import numpy as np

from experiments.lib import ROOT, results, runs, tables
from rlcode.agent import env as env_lib
from rlcode.agent import tools as tools_lib
from rlcode.agent.chat import CALL_CLOSE, CALL_OPEN
from rlcode.config import loader
from rlcode.swe import mining, workspace
from rlcode.swe.config import SweConfig

REPOS = ("data/repos/attrs.bundle", "data/repos/more-itertools.bundle")
TOOLS = ("bash", "editor", "search", "run_tests", "lint", "finish")
CONFIG = os.path.join(ROOT, "configs", "agent_swe.py")


def gold_episodes(found, max_turns: int = 400) -> list[dict]:
  """One gold episode per task: its reward details, calls and seconds."""
  scorer = env_lib.Scorer({"swe_tests": 1.0, "diff": 0.2},
                          {"swe_tests": {"cache": True}})
  env = env_lib.ToolEnv(tools_lib.make_tools(TOOLS), scorer, max_turns=max_turns,
                        episode_seconds=3600.0)
  out = []
  try:
    for task in found:
      start = time.monotonic()
      env.reset(task)
      calls = workspace.gold_calls(task)
      for name, arguments in calls:
        step = env.step(f"{CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}"
                        f"{CALL_CLOSE}", "call")
        if step.done:
          break
      details = step.info.get("reward_details", {})
      out.append({"task": task.id, "resolved": bool(details.get("swe_tests", {}).get("resolved")),
                  "reward": step.reward, "calls": len(calls), "status": step.info["status"],
                  "seconds": time.monotonic() - start})
  finally:
    env.close()
  return out


def policy_run(out: str, flags) -> dict:
  workdir = os.path.join(out, "policy")
  shutil.rmtree(workdir, ignore_errors=True)
  flags = [f"--config.workdir={workdir}", *flags]
  config = loader.resolve(loader.load_config(CONFIG, flags))
  episodes = config.rl.prompts_per_step * config.rl.group_size
  run = runs.train_process(CONFIG, flags, workdir)
  steps = runs.step_rows(run["rows"])
  keys = ("success", "tool_calls_per_episode", "turns_per_episode", "sampled_tokens",
          "context_tokens", "call_error_rate", "cut_rate", "rollout_seconds", "env_seconds")
  means = {k: float(np.mean([r[k] for r in steps])) for k in keys}
  return {"steps": len(steps), "episodes_per_step": episodes, "minutes": run["minutes"],
          "means": means, "seconds_per_episode": means["rollout_seconds"] / episodes,
          "load": [run["load_before"], run["load_after"]],
          "eval": runs.eval_rows(run["rows"], "eval/success")}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repos", nargs="+", default=list(REPOS))
  parser.add_argument("--max-tasks", type=int, default=0, help="per repository (0: all)")
  parser.add_argument("--skip-policy", action="store_true")
  parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "out", "swe_agent"))
  parser.add_argument("--name", default="agent")
  args, flags = parser.parse_known_args(argv)
  payload, rows = {"gold": {}}, []
  for repo in args.repos:
    found = mining.mine(SweConfig(source=repo), progress=True).tasks
    found = found[:args.max_tasks] if args.max_tasks else found
    episodes = gold_episodes(found)
    payload["gold"][repo] = episodes
    resolved = sum(e["resolved"] for e in episodes)
    rows.append([os.path.basename(repo), len(episodes),
                 f"{resolved} ({resolved / max(1, len(episodes)):.0%})",
                 f"{np.mean([e['calls'] for e in episodes]):.1f}",
                 f"{np.mean([e['seconds'] for e in episodes]):.1f}"])
  table = tables.markdown(["repository", "tasks", "gold agent resolves", "calls / episode",
                           "seconds / episode"], rows, "lrrrr")
  print(table)
  payload["gold_table"] = table
  if not args.skip_policy:
    payload["policy"] = policy_run(args.out, flags)
    print(json.dumps(payload["policy"]["means"], indent=1))
  print(results.write("swe", args.name, payload))


if __name__ == "__main__":
  main()
