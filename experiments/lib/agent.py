"""What the agent_tiny experiments share: the settings their older tables ran with, a
training run in a fresh process, the held-out split read once and scored, and the
study of arms that agent/tools.py and agent/think.py run.
"""

from __future__ import annotations

import argparse
import os
import shutil

from experiments.lib import ROOT, heldout, results, runs, stats, tables
from rlcode.agent import episodes, evaluate, step_groups
from rlcode.config import loader, record
from rlcode.data import sources
from rlcode.parallel import sharding

CONFIG = os.path.join(ROOT, "configs", "agent_tiny.py")
# configs/agent_tiny.py before the stale notes (2026-12-04): the plain tasks, the perfect
# expert, 600 warm-start steps, GRPO on every training task at lr 1e-4 for 20 steps.
# The agent results recorded before then (results/agent/) ran with these settings;
# agent/tools.py, agent/think.py, agent/step_speed.py and agent/warm_start.py pin them so
# that their tables still reproduce. (An empty exclude_task_ids meant "none" then; it is
# None now.)
PLAIN = ["--config.data.path=data/agent_tasks.jsonl", "--config.agent.note_trust=0.0",
         "--config.warmstart.steps=600", "--config.rl.exclude_task_ids=None",
         "--config.optimizer.learning_rate=1e-4", "--config.train.steps=20",
         "--config.train.eval_every=10", "--config.train.checkpoint_every=10"]


def load(seed, overrides):
  """configs/agent_tiny.py resolved with the seed and the overrides."""
  return loader.load_config(CONFIG, [f"--config.seed={seed}", *overrides])


def run_arm(seed, workdir, overrides, warm_start_from=None):
  """One training run in a fresh process; its validation curve and costs. With
  `warm_start_from` (another run's workdir of the same seed and model) the run starts
  from that run's warm start instead of making its own: an arm that differs only after
  the warm start, at the cost of its GRPO phase alone."""
  flags = [f"--config.seed={seed}", f"--config.workdir={workdir}",
           "--config.train.progress_bar=false", *overrides]
  if warm_start_from is not None and not os.path.isdir(os.path.join(workdir, "checkpoints")):
    source = os.path.join(warm_start_from, "warm_start")
    if not os.path.isdir(source):
      raise SystemExit(f"--warm-start-from: {source} does not exist")
    shutil.copytree(source, os.path.join(workdir, "warm_start"))
    shutil.copytree(source, os.path.join(workdir, "checkpoints"))
    record.write_run_config(loader.load_config(CONFIG, flags), workdir)
  run = runs.train_process(CONFIG, flags, workdir)
  steps = runs.step_rows(run["rows"])
  evals = runs.eval_rows(run["rows"], "eval/success")
  return {"minutes": run["minutes"], "cpu_minutes": run["cpu_minutes"],
          "load": [run["load_before"][0], run["load_after"][0]],
          "train_seconds": runs.train_seconds(steps, ("rollout_seconds", "update_seconds"),
                                              optional=("expert_logprob_seconds",)),
          "val_steps": [r["step"] for r in evals],
          "val_success": [r["eval/success"] for r in evals],
          "val_tool_calls": [r["eval/tool_calls_per_episode"] for r in evals],
          "val_context_tokens": [r["eval/context_tokens"] for r in evals]}


def split_tasks(config, split: str):
  """The tasks of a split of config.data of the families config.agent.variants names,
  read once to score every policy of a run on them (a held-out split through
  experiments.lib.heldout, which records the read)."""
  return step_groups.select_variants(config.agent.variants, heldout.tasks(config, split))


def make_envs(config, n: int, embed=None):
  """n environments of a config's agent section, scored by its rewards."""
  return episodes.make_envs(config.agent, n, rewards_cfg=config.rewards,
                            reward_options=config.reward_options, embed=embed)


def evaluate_on(config, model, tokenizer, tasks, mesh) -> dict:
  """The agent loop's evaluation (rlcode.agent.evaluate.evaluate, config.eval's episodes)
  of a policy on tasks already read."""
  chat = episodes.chat_format(config.agent, tokenizer)
  envs = make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                   embed=episodes.embedder(config.agent))
  with episodes.closing(envs):
    return evaluate.evaluate(config.eval, config.agent, model, chat, envs, tasks,
                             episodes.budgets(config.agent), mesh, seed=config.seed)


def evaluate_split(config, model, tokenizer, split: str, mesh) -> dict:
  """evaluate_on the tasks of a split of config.data (families as config.agent.variants),
  read without a record: for the tuning splits."""
  tasks = step_groups.select_variants(config.agent.variants, sources.load(config.data, split))
  return evaluate_on(config, model, tokenizer, tasks, mesh)


def held_out(config, directory, mesh, tasks) -> dict:
  """evaluate_on the held-out `tasks` of the policy saved in `directory`."""
  model, tokenizer, _, _ = runs.restore_policy(config, directory, mesh)
  return evaluate_on(config, model, tokenizer, tasks, mesh)


def study(arms, description, out_name, topic="agent"):
  """Trains each arm (overrides of configs/agent_tiny.py under PLAIN) for each --seed from
  scratch, scores its warm start and its final policy on the held-out split once, prints
  the table and writes results/<topic>/<out_name>/ (the runs stay under --out)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0])
  parser.add_argument("--out", default=os.path.join(ROOT, f"experiments/out/{out_name}"))
  parser.add_argument("--name", default=out_name, help="the result's name under results/")
  parser.add_argument("--warm-start-only", action="store_true",
                      help="no GRPO steps: compare the arms' warm starts (same budget)")
  args, overrides = parser.parse_known_args()
  overrides = [*PLAIN, *overrides]  # the settings these tables were made with
  if args.warm_start_only:
    overrides = [*overrides, "--config.train.steps=0"]
  os.makedirs(args.out, exist_ok=True)
  found, first = {}, None
  for name, arm in arms.items():
    found[name] = []
    for seed in args.seeds:
      workdir = os.path.join(args.out, f"{name}_seed{seed}")
      extra = [*arm, *overrides]
      run = run_arm(seed, workdir, extra)
      config = load(seed, extra)
      first = config if first is None else first
      mesh = sharding.mesh_from_config(config.mesh)
      tasks = split_tasks(config, "held_out")
      warm = held_out(config, os.path.join(workdir, "warm_start"), mesh, tasks)
      run["held_out"] = {"warm_start": warm,
                         "final": warm if args.warm_start_only else held_out(config, workdir,
                                                                             mesh, tasks)}
      found[name].append(run)
      results.write_json({"results": found, "overrides": overrides},
                         os.path.join(args.out, f"{out_name}.json"))
  lines = []
  for name, arm_runs in found.items():
    h = lambda key, arm="final": stats.mean_se([r["held_out"][arm][key] for r in arm_runs],
                                               se_of_one=float("nan"))
    (w, _), (s, se) = h("success", "warm_start"), h("success")
    lines.append([name, f"{w:.3f} -> {s:.3f} ± {se:.3f}", f"{h('context_tokens')[0]:.0f}",
                  f"{h('tool_calls_per_episode')[0]:.2f}",
                  f"{sum(r['minutes'] for r in arm_runs) / len(arm_runs):.1f}",
                  f"{min(r['load'][0] for r in arm_runs):.1f}-"
                  f"{max(r['load'][1] for r in arm_runs):.1f}"])
  print(tables.markdown(["arm", "held-out success (warm start -> final)",
                         "context tokens / episode", "tool calls / episode", "minutes",
                         "load"], lines, "lrrrrr"))
  results.write(topic, args.name, {"results": found, "overrides": overrides}, config=first)
