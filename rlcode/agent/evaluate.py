"""Evaluating a tool-using policy: episodes of every evaluation task, and their metrics."""

from __future__ import annotations

from rlcode.agent import episodes, expert, sampler, step_groups
from rlcode.data import sources


def evaluate(config, model, chat, envs, tasks, budgets, mesh) -> dict:
  """config.eval.num_samples episodes of every task, batch_prompts tasks at a time."""
  ev, agent = config.eval, config.agent
  trajs = []
  for start in range(0, len(tasks), ev.batch_prompts):
    chunk = tasks[start:start + ev.batch_prompts]
    trajs += sampler.run_episodes(
        model, chat, envs[:len(chunk) * ev.num_samples], chunk, group_size=ev.num_samples,
        budgets=budgets, temperature=ev.temperature, seed=config.seed + 7919 + start,
        mesh=mesh, workers=agent.workers)
  return {**episodes.episode_metrics(trajs, agent.success_reward),
          **expert.hint_metrics(trajs), "n_tasks": len(tasks), "n_episodes": len(trajs)}


def evaluate_policy(config, model, tokenizer, split: str, mesh) -> dict:
  """`evaluate` of a policy on a split of config.data (families as config.agent.variants)."""
  tasks = step_groups.select_variants(config, sources.load(config.data, split))
  chat = episodes.chat_format(config, tokenizer)
  envs = episodes.make_envs(config, config.eval.batch_prompts * config.eval.num_samples,
                            embed=episodes.embedder(config.agent))
  with episodes.closing(envs):
    return evaluate(config, model, chat, envs, tasks, episodes.budgets(config.agent), mesh)
