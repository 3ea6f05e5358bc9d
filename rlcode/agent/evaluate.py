"""Evaluating a tool-using policy: episodes of every evaluation task, and their metrics."""

from __future__ import annotations

from rlcode.agent import episodes, expert, sampler


def evaluate(ev, agent, model, chat, envs, tasks, budgets, mesh, *, seed: int) -> dict:
  """ev.num_samples episodes of every task (ev: config.eval, agent: config.agent),
  batch_prompts tasks at a time; `seed`: the run's."""
  trajs = []
  for start in range(0, len(tasks), ev.batch_prompts):
    chunk = tasks[start:start + ev.batch_prompts]
    trajs += sampler.run_episodes(
        model, chat, envs[:len(chunk) * ev.num_samples], chunk, group_size=ev.num_samples,
        budgets=budgets, temperature=ev.temperature, seed=seed + 7919 + start,
        mesh=mesh, workers=agent.workers)
  return {**episodes.episode_metrics(trajs, agent.success_reward),
          **expert.hint_metrics(trajs), "n_tasks": len(tasks), "n_episodes": len(trajs)}
