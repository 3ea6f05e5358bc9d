"""The RL algorithms: advantages, the clipped objective, batch layouts, the jitted update,
rollouts, asynchronous rollouts and curricula.

  advantages.py      group-relative advantages (grpo, dr_grpo)
  objective.py       the clipped surrogate, the k3 KL, loss aggregations
  logprobs.py        token log-probabilities, entropies and cross-entropy (the one definition)
  sequences.py       the repeated layout: prompt + completion rows, a target window
  shared_prefix.py   the shared layout: each group's prompt once, completions merged by LSE
  packing.py         the packed layout: the shared one with completions packed into budgets
  grpo.py            the one-jit update step, reference log-probs, the decoupled-PPO correction
  rollout.py         tasks -> samples -> rewards (host side)
  async_rollouts.py  the sampler thread: versioned weights, bounded staleness, weight sync
  curriculum.py      task streams weighted by the share of groups with a signal
  dynamic.py         DAPO's dynamic sampling: rounds until the groups carry a signal
  distill.py         on-policy distillation: a teacher's log-probs as a per-token reward
"""
