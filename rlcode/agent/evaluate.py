"""Evaluating a tool-using policy: episodes of every evaluation task, and their metrics.
"""

from __future__ import annotations

import os
from flax import nnx
from rlcode.runs import checkpoint
from rlcode import optim
from rlcode.rl import objective
from rlcode.agent import episodes, sampler
from rlcode.data import sources
from rlcode.models.build import build_model
from rlcode.agent import step_groups


def evaluate(config, model, chat, envs, tasks, budgets, mesh) -> dict:
  """config.eval.num_samples episodes of every task, batch_prompts tasks at a time."""
  ev, agent = config.eval, config.agent
  trajs = []
  for start in range(0, len(tasks), ev.batch_prompts):
    chunk = tasks[start:start + ev.batch_prompts]
    trajs += sampler.run_episodes(
        model, chat, envs[:len(chunk) * ev.num_samples], chunk, group_size=ev.num_samples,
        budgets=budgets, temperature=ev.temperature, seed=config.seed + 7919 + start,
        mesh=mesh, workers=agent.workers, min_tasks=ev.batch_prompts)
  return {**episodes.episode_metrics(trajs, agent.success_reward), "n_tasks": len(tasks),
          "n_episodes": len(trajs)}


def restore_policy(config, path: str, mesh):
  """(model, tokenizer, step) of the latest checkpoint under `path` (a workdir, its
  checkpoints/ directory, or its warm_start/ directory)."""
  nested = os.path.join(path, "checkpoints")
  directory = nested if os.path.isdir(nested) else path
  model, tokenizer = build_model(config.model, mesh, config.seed)
  optimizer = optim.make_optimizer(optim.OptimizerConfig.from_config(config.optimizer))
  with_ref = objective.LossConfig.from_config(config.rl, config.agent.max_total_tokens).uses_reference
  with checkpoint.Checkpointer(directory) as ckpt:
    restored, _, step = ckpt.restore(
        checkpoint.bundle_like(optim.init_state(model, optimizer, mesh), with_ref))
  graphdef, _ = nnx.split(model, nnx.Param)
  return nnx.merge(graphdef, restored["state"].params), tokenizer, step


def evaluate_policy(config, model, tokenizer, split: str, mesh) -> dict:
  """`evaluate` of a policy on a split of config.data (variants as config.agent.variants)."""
  tasks = step_groups.select_variants(config, sources.load(config.data, split))
  chat = episodes.chat_format(config, tokenizer)
  envs = episodes.make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                           embed=episodes.embedder(config.agent))
  try:
    return evaluate(config, model, chat, envs, tasks, episodes.budgets(config.agent), mesh)
  finally:
    for env in envs:
      env.close()
